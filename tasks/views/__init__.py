"""Training views: the (anchor, positive) rows a recipe trains on, built by the pairs stage (tasks/pairs.py;
docs/methods.md §1). Which view a recipe reads is in the recipe registry (tasks/config/recipes.py).

crops: two distinct crops of the same document, drawn uniformly (crops, retromae_infonce);
same:  one crop used twice (dropout, simcse, ct: the model's dropout makes the views differ;
       mlm and retromae read only the anchor and mask it themselves at each step);
noise: anchor = the crop with words deleted, positive = the crop itself (tsdae's input, target);
summaries: anchor = an LLM summary of the document, positive = another of its summaries, or its
       title (title_rate) or a random sentence of it (sentence_rate) instead (semcse; docs/methods.md §5);
queries: anchor = an LLM-written query of the document (training split only), positive = the document's
       passage, and with `hard_negatives` a passage the start model ranks high for the query, drawn from
       the ones the negatives stage mined; `round_trip` keeps only queries whose passage the start model
       ranked within that top (gpl, inpars; docs/gpl.md).
A crop is n consecutive kept sentences; documents with fewer than 2 crops are dropped for every view, so that all
recipes train on the same documents with the same budget. Each epoch has one row per document in a fresh random
order, so no document appears twice in a batch.

The first three are crops.py's (the noise's word deletion is noise.py's), the others summaries.py's and queries.py's;
the documents every view leaves out (kNN's test split, the yardstick's) are tasks/core/held_out.py's.
"""

import pyarrow as pa

# Every view's columns; the summaries and queries views add their own after them.
PAIRS_SCHEMA = pa.schema([("epoch", pa.int32()), ("doc_id", pa.string()), ("anchor", pa.string()),
                          ("positive", pa.string())])
