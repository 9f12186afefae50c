"""The semantic benchmark (SemCSE, docs/methods.md §5): does the model place related texts of one paper
close together? Four scores, rows in the same metrics catalog as every other evaluation:

    semantic_rank_title_abstract   average rank (1 = best) of a paper's abstract for its title
    semantic_rank_halves           ... of the second half of an abstract for its first half
    semantic_rank_summary_paper    ... of the paper's abstract for each of its usable LLM summaries
    semantic_same_label_5nn        share of a labelled document's 5 nearest others with its label

Ranks are among the first `limit` documents (cosine, tasks/metrics/semantic.py). The abstracts'
vectors come from the embeddings cache; titles, halves and summaries are encoded here with the
model's own pooling.

Inputs: `documents`, `embeddings` (the documents' embed artifact), `summaries` (the summarize
artifact, when the run has summaries), `model` (the train or init artifact holding it, if any).
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow.compute as pc
from pydantic import Field

from storage.base import ArtifactRef
from storage.catalog import metrics_table
from storage.store import ArtifactStore, ArtifactWriter
from tasks import embed
from tasks.config.base import Precision, Section
from tasks.config.evaluation import Backend, EvaluateConfig, SemanticConfig
from tasks.core.stage import Stage
from tasks.encoders import encode
from tasks.encoders.inputs import prompted
from tasks.encoders.models import model_identity
from tasks.metrics import semantic


class SemanticJob(Section):
    label: str
    model: str | None = Field(None, description="External model; None when the inputs carry it.")
    dataset: str
    pooling: str = "mean"
    semantic: SemanticConfig
    max_length: int
    batch_size: int
    device: str = "auto"
    dtype: Precision = EvaluateConfig.model_fields["dtype"].default
    backend: Backend = EvaluateConfig.model_fields["backend"].default
    prompt: str = Field("", description="Put before the titles, halves and summaries, as before the abstracts "
                        "(model.prompts' document one).")


class SemanticInputs(embed.EmbeddedDocumentsInputs):
    summaries: ArtifactRef | None = None


def build_semantic(store: ArtifactStore, job: SemanticJob, inputs: SemanticInputs,
                   out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = store.read_table(inputs.documents, "documents").to_pandas()
    abstracts = embed.read_embeddings(store, inputs.embeddings, job.pooling)
    n = min(len(docs), job.semantic.limit or len(docs))
    encoder = encode.encoder_at(inputs.model_location(store, job.model), job.device, job.pooling, job.dtype,
                                job.backend)

    def vectors(texts: list[str], what: str) -> np.ndarray:
        log.info("encoding %d %s", len(texts), what)
        return encoder.encode(prompted(texts, job.prompt), job.max_length, job.batch_size)

    rows = []
    titled = np.flatnonzero(docs["title"].iloc[:n].fillna("").str.strip().str.len().to_numpy() > 0)
    if len(titled) >= 2:
        titles = vectors(docs["title"].iloc[titled].tolist(), "titles")
        rows.append(dict(metric="semantic_rank_title_abstract", value=semantic.average_rank(titles, abstracts[titled]),
                         n=len(titled)))
    halved = [i for i in range(n) if len(docs["text"].iloc[i].split()) >= 2]
    halves = [semantic.split_halves(docs["text"].iloc[i]) for i in halved]
    first, second = vectors([h[0] for h in halves], "first halves"), vectors([h[1] for h in halves], "second halves")
    rows.append(dict(metric="semantic_rank_halves", value=semantic.average_rank(first, second), n=len(halved)))
    if inputs.summaries:
        table = store.read_table(inputs.summaries, "summaries")
        table = table.filter(pc.equal(table["status"], "ok"))
        position = {d: i for i, d in enumerate(docs["doc_id"].iloc[:n])}
        kept = [(position[d], t) for d, t in zip(table["doc_id"].to_pylist(), table["text"].to_pylist())
                if d in position]
        papers = sorted({i for i, _ in kept})  # candidates: the papers that have summaries
        if len(papers) >= 2:
            column = {p: j for j, p in enumerate(papers)}
            queries = vectors([t for _, t in kept], "summaries")
            rows.append(dict(metric="semantic_rank_summary_paper", n=len(kept), value=semantic.average_rank(
                queries, abstracts[papers], np.array([column[i] for i, _ in kept]))))
    labelled = np.flatnonzero(docs["label"].notna().to_numpy())
    if len(labelled) > job.semantic.k:
        rows.append(dict(metric=f"semantic_same_label_{job.semantic.k}nn", n=len(labelled),
                         value=semantic.same_label_proportion(
                             abstracts[labelled], docs["label"].iloc[labelled].tolist(), job.semantic.k)))
    out.write_table("metrics", metrics_table(rows, key=ref.key, model=inputs.model_name(job.model), dataset=job.dataset,
                                             status="ok", pooling=job.pooling,
                                             layer=max(embed.embedded_layers(store, inputs.embeddings))))
    for r in rows:
        log.info("%s = %.4f (n=%d)", r["metric"], r["value"], r["n"])


SEMANTIC = Stage("semantic", build_semantic, extra_key=lambda job: model_identity(job.model) if job.model else None,
                 gpu=True)
