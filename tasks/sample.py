"""Sample: the documents `embforge select`'s yardstick ranks among, when the corpus holds more than `select.sample`.

Every rung of the search embeds the documents its yardstick ranks, so on the whole of a large corpus the scoring, not
the training, would be the search's cost. The sample is every document a query needs and a sample of the others, drawn
by a hash of (seed, doc_id), so `select.sample` documents at most besides those needed:

- titles: each asking query's own document; the others are sampled from the whole corpus (the distractors);
- qrels: each asking query's relevant documents; the others likewise;
- labels: each asking held-out document (it asks by its own vector); the others are sampled from the labelled
  documents not held out (the only ones it ranks), with the first of each label a query asks for always in.
- clusters: none; every sampled document asks, grouped among the sample.

With a pooled kind's confirming yardstick (`select.confirm`: titles or an LLM's queries), the documents its queries
need are kept too, so the untrained model and the winner are set against each other among the same sample.

Every candidate and the untrained model are ranked on the same sample, so the paired intervals compare like with like;
the scores are those of a smaller corpus (a title finds its text among fewer), not the whole corpus's.

Inputs: `documents`, `yardstick`, `confirm`. Output `documents.parquet`: the sampled rows of the corpus, its columns,
in its order (read as a corpus by the embed and evaluate stages); the manifest gives how many of how many.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pydantic import Field

from storage.base import ArtifactRef, stable_hash
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.config.yardsticks import yardstick_kind
from tasks.core.stage import Inputs, Stage


class SampleConfig(Section):
    size: int = Field(ge=2, description="Documents drawn besides those the yardstick's queries need.")
    seed: int = 0


class SampleInputs(Inputs):
    documents: ArtifactRef
    yardstick: ArtifactRef
    confirm: ArtifactRef | None = None  # a pooled kind's confirming yardstick (`select.confirm`): its needs kept too


def build_sample(store: ArtifactStore, cfg: SampleConfig, inputs: SampleInputs, out: ArtifactWriter, ref: ArtifactRef,
               log: logging.Logger) -> None:
    docs = store.read_table(inputs.documents, "documents")
    kind = yardstick_kind(store.manifest(inputs.yardstick))
    needed = {d for y in (inputs.yardstick, inputs.confirm) if y  # as the yardsticks say
              for d in store.read_table(y, "needed")["doc_id"].to_pylist()}
    ids, labels = docs["doc_id"].to_pylist(), docs["label"].to_pylist()
    needed_rows = {i for i, d in enumerate(ids) if d in needed}
    if kind == "labels":  # it ranks the labelled documents not held out, and nothing else
        held = set(store.read_table(inputs.yardstick, "queries", columns=["doc_id"])["doc_id"].to_pylist())
        others = [i for i, (d, label) in enumerate(zip(ids, labels)) if label is not None and d not in held]
    else:
        others = [i for i in range(len(ids)) if i not in needed_rows]
    others.sort(key=lambda i: stable_hash(cfg.seed, ids[i]))
    drawn = others[: cfg.size]
    kept = needed_rows | set(drawn)
    if kind == "labels":  # every label a query asks for keeps a document to be found
        first = {}  # each label's first document in the draw's order
        for i in others:
            first.setdefault(labels[i], i)
        kept |= {first[label] for label in {labels[i] for i in needed_rows} - {labels[i] for i in drawn}}
    sampled = docs.take(pa.array(sorted(kept), pa.int64()))
    out.write_table("documents", sampled)
    out.extra.update(documents=sampled.num_rows, of=docs.num_rows, needed=len(needed))
    log.info("the yardstick ranks among %d of the %d documents (%d its queries need, a sample of the others)",
             sampled.num_rows, docs.num_rows, len(needed))


SAMPLE = Stage("sample", build_sample)
