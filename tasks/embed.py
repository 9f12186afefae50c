"""Embed: the embeddings cache. One artifact per (model, text set, max length, layers).

Every evaluation metric reads its vectors from here, so a model is encoded once per text set,
however many metrics, reports or later runs use it. One forward pass gives every requested hidden
layer and all three poolings (mean, CLS, SEP), so the layer-wise curves and a recipe's own pooling
come from the same artifact.

Inputs: `documents` (text set = its `text` column), or none with `pairs_path` (text set =
sentence1 rows then sentence2 rows of that file); `model`, the train or init artifact holding the
model, if any. Output `embeddings.parquet`: row, layer, mean, cls, sep.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter, file_digest
from tasks import encode, ingest
from tasks.config import Section
from tasks.models import ModelInputs, model_identity
from tasks.stage import Stage


class EmbedJob(Section):
    model: str | None = Field(None, description="External model (name or path); None when the inputs "
                              "carry a train or init artifact.")
    pairs_path: str | None = Field(None, description="Embed the sentences of this pairs file instead of "
                                   "the documents.")
    split: str | None = Field(None, description="With `pairs_path`: rows of this split only.")
    layers: Literal["last", "all"] = Field("last", description="`all`: every hidden state, 0 = embedding layer.")
    max_length: int
    batch_size: int
    device: str = "auto"


def _vectors(x: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


class EmbedInputs(ModelInputs):
    documents: ArtifactRef | None = None  # None: the texts of job.pairs_path


def build_embeddings(store: ArtifactStore, job: EmbedJob, inputs: EmbedInputs,
                     out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    if job.pairs_path:
        pairs = ingest.read_pairs(job.pairs_path, job.split)
        texts = pairs["sentence1"].tolist() + pairs["sentence2"].tolist()
    else:
        texts = store.read_table(inputs.documents, "documents")["text"].to_pylist()
    encoder = encode.PooledEncoder(inputs.model_location(store, job.model), job.device)
    layers = list(range(encoder.n_layers + 1)) if job.layers == "all" else [encoder.n_layers]
    log.info("%d texts, %d layer(s), max length %d", len(texts), len(layers), job.max_length)
    emb = encoder.encode_layers(texts, job.max_length, job.batch_size, layers)
    tables = [pa.table({"row": pa.array(np.arange(len(texts), dtype=np.int32)),
                        "layer": pa.array(np.full(len(texts), layer, dtype=np.int16)),
                        **{p: _vectors(emb[i, j]) for j, p in enumerate(encode.POOLINGS)}})
              for i, layer in enumerate(layers)]
    out.write_table("embeddings", pa.concat_tables(tables))
    out.extra.update(texts=len(texts), layers=layers, dim=int(emb.shape[-1]))


class EmbeddedDocumentsInputs(ModelInputs):
    """What a scoring stage reads: the documents, their embed artifact and (if embforge made it) the model."""

    documents: ArtifactRef
    embeddings: ArtifactRef


def read_embeddings(store: ArtifactStore, ref: ArtifactRef, pooling: str, layer: int | None = None) -> np.ndarray:
    """The (texts × dim) matrix of one layer (default: the last) and pooling, in text order."""
    table = store.read_table(ref, "embeddings").select(["row", "layer", pooling])
    layer = max(embedded_layers(store, ref)) if layer is None else layer
    table = table.filter(pc.equal(table["layer"], layer)).sort_by("row")
    column = table[pooling].combine_chunks()
    return column.values.to_numpy().reshape(len(column), -1)


def embedded_layers(store: ArtifactStore, ref: ArtifactRef) -> list[int]:
    return store.manifest(ref)["extra"]["layers"]


def _key_material(job: EmbedJob) -> list:
    return [model_identity(job.model) if job.model else None,
            file_digest(job.pairs_path) if job.pairs_path else None]


EMBED = Stage("embed", build_embeddings, extra_key=_key_material)
