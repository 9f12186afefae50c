"""Static: a static embedding model (a token → vector table) distilled from a model of the run, with the
libraries that define the method (docs/static.md).

model2vec's `distill` embeds every token of the teacher's vocabulary with the teacher (with
`corpus_words`, the corpus's most frequent words too, as whole tokens: tokenlearn's vocabulary), keeps
`pca_dims` principal components and weights the tokens by frequency (SIF). With `tokenlearn` the table
is then trained to give, for each of the corpus's sentences, the teacher's vector of it (featurize: the
teacher embeds them with its own pooling): what adapts a static model to the corpus.
The teacher's vectors of the sentences are kept in the store's `featurized` pool, a shard per
FEATURIZE_SHARD sentences, keyed by the teacher, its pooling, FEATURIZE_LENGTH and the encoder's code
(tasks/encoders/encode.py and what it imports): a stage killed while
featurizing resumes from the shards written, and a table made again with other settings (PCA, SIF,
vocabulary) reuses them instead of running the teacher again.
Output `model/`: a folder that `model2vec.StaticModel.from_pretrained` and `SentenceTransformer` (its
StaticEmbedding) both load; the embed stage encodes it like any model (tasks/encoders/encode.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from transformers import AutoConfig

from storage.base import ArtifactRef, stable_hash
from storage.shards import ShardPool
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError
from tasks.config.static import StaticSettings
from tasks.core.identity import code_version
from tasks.core.stage import Stage
from tasks.encoders import encode
from tasks.encoders.models import ModelInputs, load_model, model_identity, pick_device, resolve_model
from tasks.encoders.text_sets import first_texts

# model2vec's name for each embforge pooling: the token a distilled vector is read from, as the teacher pools.
DISTILL_POOLING = {"mean": "mean", "cls": "first", "sep": "last"}
FEATURIZE_LENGTH = 256  # tokens of a sentence the teacher reads when it featurizes the corpus
FEATURIZE_BATCH = 64
FEATURIZE_SHARD = 2048  # sentences a shard of the featurized pool holds: what a killed stage loses at most


class StaticJob(StaticSettings):
    model: str | None = None  # the teacher's Hub name or folder when no artifact holds it
    pooling: str = "mean"  # the teacher's sentence vector (its recipe's pooling)


class StaticInputs(ModelInputs):
    sentences: ArtifactRef  # the corpus's sentences: tokenlearn's texts and vocabulary


def corpus_sentences(store: ArtifactStore, ref: ArtifactRef, limit: int) -> list[str]:
    """The first `limit` kept sentences of the corpus, in corpus order."""
    return first_texts(store, ref, "sentences", limit, kept="kept")


def featurized(pool: ShardPool, texts: list[str], load_teacher: Callable[[], encode.Encoder],
               log: logging.Logger) -> np.ndarray:
    """The teacher's vectors of `texts` (texts, dim): each FEATURIZE_SHARD-sentence slice read from `pool` if a
    shard holds it, else encoded by the teacher (loaded by `load_teacher` at the first such slice) and written as
    a shard before the next slice is started. A slice is encoded whole, in the same batches, however often it
    was interrupted: the same vectors."""
    teacher = None
    have = pool.read()
    known = dict(zip(have["digest"].to_pylist(), have["vectors"].to_numpy(zero_copy_only=False))) if have else {}
    parts, reused = [], 0
    for start in range(0, len(texts), FEATURIZE_SHARD):
        part = texts[start : start + FEATURIZE_SHARD]
        digest = stable_hash(part)
        if digest in known:
            reused += 1
        else:
            teacher = teacher or load_teacher()
            vectors = teacher.encode(part, FEATURIZE_LENGTH, FEATURIZE_BATCH)  # (len(part), dim)
            pool.write(pa.table({"digest": [digest], "vectors": pa.array([vectors.ravel()], pa.list_(pa.float32()))}))
            known[digest] = vectors.ravel()
        parts.append(np.asarray(known[digest], dtype=np.float32).reshape(len(part), -1))  # (len(part), dim)
    if reused:
        log.info("featurized: %d of %d slices of up to %d sentences read from the pool", reused, len(parts),
                 FEATURIZE_SHARD)
    return np.concatenate(parts)


def build_static(store: ArtifactStore, job: StaticJob, inputs: StaticInputs,
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    from model2vec.distill import distill
    from model2vec.model import quantize_model
    from tokenlearn.train import train_model
    from tokenlearn.utils import create_vocab

    teacher = resolve_model(inputs.model_location(store, job.model))
    dim = load_model(teacher, AutoConfig.from_pretrained).hidden_size
    if job.pca_dims is not None and job.pca_dims > dim:
        raise InputError(f"static.pca_dims: {job.pca_dims} is more than the teacher's {dim} dimensions "
                         f"({inputs.model_name(job.model)}); at most {dim}, or null to keep them")
    texts = corpus_sentences(store, inputs.sentences, job.sentences)
    if job.tokenlearn and len(texts) < (job.pca_dims or dim):
        raise InputError(f"static.tokenlearn: the corpus has {len(texts)} kept sentences, fewer than the "
                         f"{job.pca_dims or dim} dimensions its targets are reduced to; a larger corpus, fewer "
                         "static.pca_dims, or static.tokenlearn: false")
    device = pick_device(job.device)
    vocabulary = create_vocab(texts, job.corpus_words) if job.corpus_words else None
    log.info("distilling %s (%d dims, %s pooling) into a static model: %s vocabulary, PCA %s, SIF %s",
             inputs.model_name(job.model), dim, job.pooling,
             f"its own + up to {job.corpus_words:,} corpus words" if vocabulary else "its own", job.pca_dims,
             job.sif_coefficient)
    torch.manual_seed(0)  # PCA and tokenlearn's shuffling draw from the global generators (the stage holds them)
    np.random.seed(0)
    model = distill(model_name=teacher, vocabulary=vocabulary, device=device, pca_dims=job.pca_dims,
                    sif_coefficient=job.sif_coefficient, quantize_to="float32", pooling=DISTILL_POOLING[job.pooling])
    if job.tokenlearn:
        log.info("featurizing %d sentences with the teacher, then training the table on its vectors", len(texts))
        # per teacher, pooling and length, and the encoder's code: vectors of changed code are made again
        pool = store.pool("featurized", stable_hash(inputs.model_name(job.model), model_identity(job.model)
                                                    if job.model else None, job.pooling, FEATURIZE_LENGTH,
                                                    code_version(encode.__name__)))
        vectors = featurized(pool, texts, lambda: encode.PooledEncoder(teacher, job.device, job.pooling),
                             log)  # (sentences, dim)
        model = train_model(model, texts, vectors, device=device, pca_dims=job.pca_dims or dim)
    model = quantize_model(model, quantize_to=job.dtype)  # trained in float32, stored as asked
    model.save_pretrained(str(out.folder / "model"))
    out.extra.update(teacher=inputs.model_name(job.model), vocabulary=model.tokenizer.get_vocab_size(),
                     dim=int(model.dim), sentences=len(texts) if job.tokenlearn else 0)
    log.info("static model: %d tokens x %d dims, %.1f MB", out.extra["vocabulary"], out.extra["dim"],
             sum(f.stat().st_size for f in Path(out.folder / "model").iterdir()) / 1e6)


STATIC = Stage("static", build_static, extra_key=lambda job: model_identity(job.model) if job.model else None,
               gpu=True, seeds_global_rng=True)
