"""The summaries view (SemCSE; docs/methods.md §5): an LLM summary of a document as anchor, and as positive another
of its summaries, its title or one of its sentences."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.base import ArtifactRef
from storage.store import ArtifactStore
from tasks.config.base import Section
from tasks.views import PAIRS_SCHEMA


class Replacement(Section):
    """How SemCSE picks a positive for an anchor summary."""

    title_rate: float
    sentence_rate: float
    same_input: bool


def draw_summary_pairs(summaries: dict[str, list[str]], titles: dict[str, str | None],
                       sentences: dict[str, list[str]], replacement: Replacement, epochs: int, seed: int) -> pa.Table:
    """One row per document per epoch: a random summary as anchor; as positive another summary,
    or (at the configured rates) the title or a random sentence, or with `same_input` the anchor."""
    rng = np.random.default_rng(seed)
    docs = [d for d, s in summaries.items() if len(s) >= (1 if replacement.same_input else 2)]
    cols: dict[str, list] = {"epoch": [], "doc_id": [], "anchor": [], "positive": [], "positive_kind": []}
    for epoch in range(epochs):
        for i in rng.permutation(len(docs)):
            doc, own = docs[i], summaries[docs[i]]
            a = rng.integers(len(own))
            u = rng.random()
            if replacement.same_input:
                positive, kind = own[a], "same"
            elif u < replacement.title_rate and titles.get(doc):
                positive, kind = titles[doc], "title"
            elif u < replacement.title_rate + replacement.sentence_rate and sentences.get(doc):
                positive, kind = sentences[doc][rng.integers(len(sentences[doc]))], "sentence"
            else:  # another summary of the same document
                b = rng.integers(len(own) - 1)
                positive, kind = own[b + (b >= a)], "summary"
            for name, value in zip(cols, (epoch, doc, own[a], positive, kind)):
                cols[name].append(value)
    return pa.table(cols, schema=pa.schema([*PAIRS_SCHEMA, pa.field("positive_kind", pa.string())]))


def texts_by_document(rows: pa.Table) -> dict[str, list[str]]:
    """doc_id → its `text` values, in row order."""
    result: dict[str, list[str]] = {}
    for doc, text in zip(rows["doc_id"].to_pylist(), rows["text"].to_pylist()):
        result.setdefault(doc, []).append(text)
    return result


def ok_summaries(store: ArtifactStore, ref: ArtifactRef) -> dict[str, list[str]]:
    """doc_id → the summaries the summarize stage's quality guard passed, in (prompt, sample) order."""
    table = store.read_table(ref, "summaries")
    return texts_by_document(table.filter(pc.equal(table["status"], "ok")))


def sentences_by_document(sentences: pa.Table, min_words: int = 3) -> dict[str, list[str]]:
    """Every sentence of at least `min_words` words (kept by the length filter or not), in order."""
    rows = sentences.sort_by([("doc_id", "ascending"), ("position", "ascending")])
    long_enough = pa.array([len(t.split()) >= min_words for t in rows["text"].to_pylist()], pa.bool_())
    return {doc: [t.strip() for t in texts] for doc, texts in texts_by_document(rows.filter(long_enough)).items()}
