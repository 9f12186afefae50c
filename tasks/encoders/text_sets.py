"""A text set: the texts a model encodes for evaluation, named alike by the stage that tokenizes them
(tasks/text_tokens.py) and the one that embeds them (tasks/embed.py), so that their keys line up.

It is a documents artifact's texts; or, with `pairs_path`, the sentence1 rows then the sentence2 rows of that
evaluation pairs file; or a queries artifact's usable held-out queries (docs/gpl.md).
"""

from __future__ import annotations

from pydantic import Field

from storage.base import ArtifactRef, file_digest
from storage.store import ArtifactStore
from tasks.config.base import Section
from tasks.core import eval_sets
from tasks.core.held_out import held_out_queries
from tasks.encoders.models import ModelInputs, model_identity


class TextSet(Section):
    model: str | None = Field(None, description="External model (name or path); None when the inputs "
                              "carry a train or init artifact.")
    pairs_path: str | None = Field(None, description="The sentences of this pairs file instead of the documents.")
    split: str | None = Field(None, description="With `pairs_path`: rows of this split only.")


class TextSetInputs(ModelInputs):
    documents: ArtifactRef | None = None  # None: the texts of job.pairs_path, or of the held-out queries
    held_out_queries: ArtifactRef | None = None  # a queries artifact: its held-out ok queries are the text set


def read_texts(store: ArtifactStore, text_set: TextSet, inputs: TextSetInputs) -> list[str]:
    if text_set.pairs_path:
        pairs = eval_sets.read_pairs(text_set.pairs_path, text_set.split)
        return pairs["sentence1"].tolist() + pairs["sentence2"].tolist()
    if inputs.held_out_queries:
        return held_out_queries(store, inputs.held_out_queries)["query"].to_pylist()
    return store.read_table(inputs.documents, "documents", columns=["text"])["text"].to_pylist()


def text_set_identity(job: TextSet) -> list:
    """A job's key material beyond its fields and inputs: the external model's files, the pairs file's bytes."""
    return [model_identity(job.model) if job.model else None,
            file_digest(job.pairs_path) if job.pairs_path else None]


def first_texts(store: ArtifactStore, ref: ArtifactRef, table: str, limit: int, kept: str | None = None) -> list[str]:
    """The first `limit` texts of an artifact's `table` (of its rows whose boolean column `kept` is true, if named),
    read a row group at a time as far as they go: the table grows with the corpus, the limit does not."""
    texts: list[str] = []
    with store.open_table(ref, table) as parquet:
        for g in range(parquet.num_row_groups):
            if len(texts) >= limit:
                break
            group = parquet.read_row_group(g, columns=["text", *([kept] if kept else [])])
            texts += (group.filter(group[kept]) if kept else group)["text"].to_pylist()
    return texts[:limit]
