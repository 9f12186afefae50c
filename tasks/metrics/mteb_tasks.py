"""MTEB evaluation through the `mteb` library: Hub tasks by name, and local tasks from Parquet.

A model is evaluated the way the cropping paper wrapped models for MTEB: a sentence-transformers
model made of the Transformer (truncating at `max_length`), the pooling the model was trained
with, and a Normalize module. Any plain Hugging Face folder works: no sentence-transformers files
are needed.

Hub tasks need their data from the Hub or a local Hugging Face cache. Without it (or for an unknown
name) the task yields one `skipped` row instead of an error, and it says so at once: offline mode
fails immediately, and with the Hub unreachable a short connection probe replaces the ~25 s of
retries `datasets` would spend per task.

Local tasks (`LocalTaskConfig`) are real mteb task classes whose `load_data` reads Parquet:
- clustering: documents (text, label, optional title); the text clustered is "title text", the
  join mteb uses for retrieval corpora; rows without a label are dropped. All kept documents are
  embedded, and each of mteb's 10 k-means runs clusters a bootstrap sample of that size.
- sts: pairs (sentence1, sentence2, score).
- pair_classification: the same pairs, label = score >= positive_at.
- retrieval: corpus (doc_id, text, optional title) + queries (query_id, query, doc_id, score):
  one row per relevant document. `split` and `limit` apply to the queries; the corpus is kept whole
  (fewer distractors would make retrieval easier), except that `corpus_limit`, or a trial run's (`limit`
  set) MAX_TRIAL_CORPUS, keeps the relevant documents plus a seeded random sample of the others.
`split` keeps rows of that split (its name is the evaluated split; "all" when None), then `limit`
keeps the first N pairs / documents / queries.

Every row: metric (task name), value (main score, None if skipped), std, n (evaluated pairs /
documents / queries), repeats, split, subset, task_type, main_score, revision (dataset revision as
mteb reports it; for local tasks a digest of the files and settings), mteb_version, dtype,
batch_size, max_length, status (ok / skipped), note.
"""

from __future__ import annotations

import logging
import re
import socket
from functools import cache
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import datasets
import pandas as pd
import torch
from datasets import Dataset
from huggingface_hub import constants as hub_constants
from sentence_transformers import MultiVectorEncoder, SentenceTransformer, SparseEncoder, models

from storage.base import file_digest, stable_hash
from tasks.config.base import InputError
from tasks.config.evaluation import MAX_TRIAL_CORPUS, LocalTaskConfig, MtebSettings
from tasks.config.model import Prompts
from tasks.core.eval_sets import read_pairs, read_table, rows_of_split
from tasks.core.rng import global_rng_kept
from tasks.encoders import decoders, families
from tasks.encoders.budget import char_budget, cut_texts, over_budget
from tasks.encoders.encode import is_static
from tasks.encoders.models import POOLING_MODES, load_model, pick_device

with global_rng_kept():  # importing mteb seeds the process-wide generators with 42
    import mteb
    from mteb.abstasks import (
        AbsTask,
        AbsTaskClustering,
        AbsTaskClusteringLegacy,
        AbsTaskPairClassification,
        AbsTaskRetrieval,
        AbsTaskSTS,
    )
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.models import MultiVectorWrapper, SentenceTransformerEncoderWrapper, SparseEncoderWrapper

HUB_PROBE_TIMEOUT_S = 3.0


# ---------------------------------------------------------------- local tasks


def split_columns(cfg: LocalTaskConfig) -> list[str]:
    return [] if cfg.split is None else ["split"]


def with_titles(table: pd.DataFrame) -> list[str]:
    """'title text' where a title exists, else the text: how mteb joins retrieval documents."""
    if "title" not in table.columns:
        return table["text"].tolist()
    return [f"{title} {text}".strip() if isinstance(title, str) and title else text
            for title, text in zip(table["title"], table["text"])]


def trial_corpus(corpus: pd.DataFrame, relevant_ids: set[str], size: int) -> pd.DataFrame:
    """Every relevant document and a seeded sample of the others, `size` in all (more where more are relevant)."""
    relevant = corpus["doc_id"].isin(relevant_ids)
    others = corpus[~relevant].sample(n=max(0, size - int(relevant.sum())), random_state=0)
    return corpus[relevant | corpus.index.isin(others.index)]


MTEB_TYPES = {"clustering": "Clustering", "sts": "STS", "retrieval": "Retrieval",
              "pair_classification": "PairClassification"}
MAIN_SCORES = {"clustering": "v_measure", "sts": "cosine_spearman", "retrieval": "ndcg_at_10",
               "pair_classification": "max_ap"}


class LocalTask:
    """What the local task classes share: metadata made from the config, and `load_data` calling
    the class's `read()` (the split's data in the layout its mteb base class evaluates)."""

    def __init__(self, cfg: LocalTaskConfig):
        self.cfg = cfg
        files = [cfg.path] + ([cfg.queries] if cfg.queries else [])
        revision = stable_hash([file_digest(f) if Path(f).is_file() else None for f in files],
                               cfg.model_dump(exclude={"name", "path", "queries"}))
        self.metadata = TaskMetadata(
            name=cfg.name, description=f"Local {cfg.type} task built from {Path(cfg.path).name}.",
            dataset={"path": cfg.path, "revision": revision}, type=MTEB_TYPES[cfg.type], category="t2t",
            modalities=["text"], eval_splits=[self.split_name], eval_langs=["eng-Latn"],
            main_score=MAIN_SCORES[cfg.type])
        super().__init__()

    @property
    def split_name(self) -> str:
        return self.cfg.split or "all"

    def load_data(self, num_proc: int | None = None, **kwargs) -> None:
        if not self.data_loaded:
            self.dataset = {"default": {self.split_name: self.read()}}
            self.data_loaded = True

    def unload_data(self) -> None:
        # mteb's version also drops instance metadata (its tasks keep metadata on the class).
        self.dataset, self.data_loaded = None, False


class LocalClustering(LocalTask, AbsTaskClustering):
    max_fraction_of_documents_to_embed = None  # mteb's default embeds only 4% of the documents

    def read(self) -> Dataset:
        docs = read_table(self.cfg.path, ["text", "label"] + split_columns(self.cfg))
        docs = rows_of_split(docs[docs["label"].notna()], self.cfg.split, self.cfg.path).iloc[: self.cfg.limit]
        self.max_documents_per_cluster = len(docs)
        return Dataset.from_dict({"sentences": with_titles(docs), "labels": docs["label"].astype(str).tolist()})


class LocalSTS(LocalTask, AbsTaskSTS):
    # Scores are min-max normalised by the class's 0-5 range: a linear map, so correlations do not change.
    def read(self) -> Dataset:
        pairs = read_pairs(self.cfg.path, self.cfg.split, self.cfg.limit)
        return Dataset.from_dict({c: pairs[c].tolist() for c in ["sentence1", "sentence2", "score"]})


class LocalPairClassification(LocalTask, AbsTaskPairClassification):
    def read(self) -> Dataset:
        pairs = read_pairs(self.cfg.path, self.cfg.split, self.cfg.limit)
        return Dataset.from_dict({"sentence1": pairs["sentence1"].tolist(), "sentence2": pairs["sentence2"].tolist(),
                                  "labels": (pairs["score"] >= self.cfg.positive_at).astype(int).tolist()})


class LocalRetrieval(LocalTask, AbsTaskRetrieval):
    """Keeps each query's nDCG@10 from mteb's own scoring (`per_query`), so that two models can be
    compared query by query, with an interval, and not only by the mean."""

    per_query: dict[str, float] | None = None

    def task_specific_scores(self, scores, qrels, results, hf_split, hf_subset) -> dict[str, float]:
        self.per_query = {query: s["ndcg_cut_10"] for query, s in scores.items()}  # mteb's ndcg_at_10 is their mean
        return super().task_specific_scores(scores, qrels, results, hf_split, hf_subset)

    def read(self) -> dict:
        cfg = self.cfg
        corpus = read_table(cfg.path, ["doc_id", "text"]).astype({"doc_id": str})
        qrels = read_table(cfg.queries, ["query_id", "query", "doc_id", "score"] + split_columns(cfg))
        qrels = rows_of_split(qrels, cfg.split, cfg.queries).astype({"query_id": str, "doc_id": str})
        queries = qrels.drop_duplicates("query_id").iloc[: cfg.limit]
        qrels = qrels[qrels["query_id"].isin(queries["query_id"])]
        unknown = qrels[~qrels["doc_id"].isin(corpus["doc_id"])]
        if len(unknown):
            doc, query = unknown.iloc[0][["doc_id", "query_id"]]
            raise InputError(f"{cfg.queries}: doc_id {doc!r} (query {query!r}) is not in {cfg.path}")
        size = cfg.corpus_limit or (MAX_TRIAL_CORPUS if cfg.limit else None)
        if size and len(corpus) > size:
            corpus = trial_corpus(corpus, set(qrels["doc_id"]), size)
        titles = corpus["title"] if "title" in corpus.columns else pd.Series("", index=corpus.index)
        relevant: dict[str, dict[str, int]] = {}
        for query, doc, score in zip(qrels["query_id"], qrels["doc_id"], qrels["score"]):
            relevant.setdefault(query, {})[doc] = int(score)
        return dict(
            corpus=Dataset.from_dict({"id": corpus["doc_id"].tolist(), "text": corpus["text"].tolist(),
                                      "title": titles.fillna("").tolist()}),
            queries=Dataset.from_dict({"id": queries["query_id"].tolist(), "text": queries["query"].tolist()}),
            relevant_docs=relevant, top_ranked=None)


LOCAL_TASKS = {"clustering": LocalClustering, "sts": LocalSTS, "retrieval": LocalRetrieval,
               "pair_classification": LocalPairClassification}


# ---------------------------------------------------------------- Hub tasks


class Skipped(Exception):
    """A task that cannot be evaluated here; the message is the row's note."""


@cache
def hub_reachable(endpoint: str) -> bool:
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=HUB_PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def hub_task(name: str) -> AbsTask:
    """The named mteb task, English subsets only."""
    try:
        task = mteb.get_task(name)
    except KeyError:
        raise Skipped("unknown MTEB task") from None
    if task.metadata.is_multilingual:
        try:
            task = task.filter_languages(["eng"], exclusive_language_filter=True)
        except ValueError:
            raise Skipped("no English subset") from None
    return task


def load_hub_data(task: AbsTask) -> None:
    # With the Hub unreachable, `datasets` retries for ~25 s before using the cache; offline mode
    # (HF_HUB_OFFLINE=1) reads the cache at once, so only probe when it is off.
    if not datasets.config.HF_HUB_OFFLINE and not hub_reachable(hub_constants.ENDPOINT):
        raise Skipped(f"data not reachable: {hub_constants.ENDPOINT} unreachable "
                      "(set HF_HUB_OFFLINE=1 to use the local Hugging Face cache)")
    try:
        task.load_data()
    except OSError as e:  # offline, not cached, gated or gone: datasets and huggingface_hub raise OSErrors
        raise Skipped(f"data not reachable: {str(e).splitlines()[0][:200]}") from None


# ---------------------------------------------------------------- evaluation


class BoundedTransformer(models.Transformer):
    """sentence-transformers' Transformer module that cuts each text to the character budget of its
    max length before tokenizing (tasks/encoders/budget.py), and counts the texts it cut."""

    cut = 0

    def preprocess(self, inputs, prompt=None, **kwargs):
        if all(isinstance(text, str) for text in inputs):
            self.cut += over_budget(inputs, self.max_seq_length)
            inputs = cut_texts(inputs, self.max_seq_length)
        return super().preprocess(inputs, prompt=prompt, **kwargs)


def mteb_encoder(model: str, pooling: str, cfg: MtebSettings, device: str, name: str,
                 revision: str | None, prompts: Prompts | None = None, search: bool = False,
                 ) -> SentenceTransformerEncoderWrapper | MultiVectorWrapper | SparseEncoderWrapper:
    """The model as mteb evaluates it, under `name` and `revision` (what mteb files its results by), with `prompts`
    (mteb reads queries with the query one, documents and symmetric tasks' texts with the document one). A static
    model (tasks/static.py) as sentence-transformers loads it: its StaticEmbedding, which pools itself. A multi-vector
    model (tasks/encoders/families.py) as it was saved: for a task that takes a search model (`search`: retrieval),
    through mteb's own late-interaction wrapper, by exact MaxSim over the whole corpus; for the others, as one
    vector a text, its mean token vector (as the embed stage reads it). A sparse model as it was saved, through mteb's
    sparse wrapper: retrieval by the codes' dot product, the other tasks on the codes as they are."""
    prompted = (prompts or Prompts()).sentence_transformers()
    family = families.family_of(model)
    if is_static(model):
        encoder = load_model(model, lambda p: SentenceTransformer(p, device=pick_device(device)))
    elif family != "dense":
        encoder = families.load_saved(model, pick_device(device), **prompted)
        encoder[0].__class__ = BoundedTransformer  # the same module, cutting texts as every other path does
        encoder.max_seq_length = cfg.max_length
        # a multi-vector model outside search: its modules, then the mean over the scoring mask (a document's:
        # punctuation left out)
        if family == "multi_vector" and not search:
            pool = models.Pooling(encoder.get_embedding_dimension(), pooling_mode="mean")
            encoder = SentenceTransformer(modules=[*encoder, pool, models.Normalize()], device=pick_device(device),
                                          **prompted)
        encoder.to(getattr(torch, cfg.dtype))
    else:
        transformer = load_model(model, lambda p: BoundedTransformer(p, max_seq_length=cfg.max_length))
        decoders.ready_transformer(transformer)
        pool = models.Pooling(transformer.get_embedding_dimension(), pooling_mode=POOLING_MODES[pooling])
        encoder = SentenceTransformer(modules=[transformer, pool, models.Normalize()], device=pick_device(device),
                                      **prompted)
        encoder.to(getattr(torch, cfg.dtype))
    wrapper = {MultiVectorEncoder: MultiVectorWrapper, SparseEncoder: SparseEncoderWrapper}.get(
        type(encoder), SentenceTransformerEncoderWrapper)
    wrapped = wrapper(encoder)
    wrapped.mteb_model_meta = wrapped.mteb_model_meta.model_copy(update={"name": name, "revision": revision})
    return wrapped


def results_name(model_name: str, pooling: str, recipe: str | None = None) -> str:
    """The name embforge's mteb results carry: `embforge/<recipe>-<pooling>` for a model embforge
    made (its artifact key is the revision), else the model's own name (`org/model`, a folder's name)."""
    if recipe:
        return f"embforge/{recipe}-{pooling}"
    name = model_name.removeprefix("package:").rstrip("/")
    if name.count("/") != 1 or Path(name).exists():  # a folder, not an org/model Hub id
        name = f"local/{Path(name).name}"
    return f"{name}-{pooling}" if pooling != "mean" else name


def task_type(task: AbsTask) -> str:
    """mteb's task type in snake case: PairClassification -> pair_classification, STS -> sts."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", task.metadata.type).lower()


def evaluated_items(task: AbsTask, split: str, subset: str) -> int:
    """Pairs, documents or queries mteb scored (read after evaluation: retrieval drops queries
    without relevant documents)."""
    data = task.dataset[subset][split] if subset in task.dataset else task.dataset[split]
    if isinstance(task, AbsTaskRetrieval):
        return len(data["queries"])
    if isinstance(task, AbsTaskClusteringLegacy):  # one row per clustering set, holding lists
        return sum(len(docs) for docs in data[task.input_column_name])
    if isinstance(task, AbsTaskClustering):
        if task.max_fraction_of_documents_to_embed is not None:
            return min(len(data), int(task.max_fraction_of_documents_to_embed * len(data)))
        return min(len(data), task.max_document_to_embed or len(data))
    if isinstance(task, AbsTaskPairClassification) and len(data) == 1:  # mteb 1.x layout: one row of lists
        return len(data[0][task.label_column_name])
    return len(data)


def row(cfg: MtebSettings, name: str, **fields) -> dict:
    base = dict(metric=name, value=None, std=None, n=None, repeats=1, split=None, task_type=None,
                revision=None, mteb_version=mteb.__version__, main_score=None, subset=None,
                dtype=cfg.dtype, batch_size=cfg.batch_size, max_length=cfg.max_length, status="ok", note=None)
    return base | fields


class Scored(NamedTuple):
    rows: list[dict]  # one per split and subset, or one `skipped` row
    cut: int  # texts cut to the character budget before tokenizing
    per_query: dict[str, float] | None = None  # a local retrieval task's nDCG@10 of each query


def evaluate_mteb(model: str, pooling: str, cfg: MtebSettings, task: str | LocalTaskConfig, device: str,
                  results: Path, meta: tuple[str, str | None], log: logging.Logger, prompts: Prompts | None = None,
                  ) -> Scored:
    """Score one model on one MTEB task (a Hub task name or a local task). mteb writes its result
    files under `results` (a ResultCache folder), the model named and revised as `meta` says."""
    with global_rng_kept():  # mteb seeds the process-wide generators (task objects, evaluation)
        return _scores(model, pooling, cfg, task, device, results, meta, log, prompts)


def _scores(model: str, pooling: str, cfg: MtebSettings, task: str | LocalTaskConfig, device: str,
            results: Path, meta: tuple[str, str | None], log: logging.Logger, prompts: Prompts | None) -> Scored:
    name = task if isinstance(task, str) else task.name
    mteb_task = None
    try:
        if isinstance(task, str):
            mteb_task = hub_task(task)
            load_hub_data(mteb_task)
        else:
            # Loaded here, not inside mteb.evaluate, so a file problem is our InputError, and the
            # data stays loaded for counting what was evaluated.
            mteb_task = LOCAL_TASKS[task.type](task)
            mteb_task.load_data()
    except Skipped as e:
        log.warning("skipped %s: %s", name, e)
        known = {} if mteb_task is None else dict(
            task_type=task_type(mteb_task), main_score=mteb_task.metadata.main_score,
            revision=mteb_task.metadata.revision, split=",".join(mteb_task.eval_splits))
        return Scored([row(cfg, name, status="skipped", note=str(e), **known)], 0)
    # mteb's own flag for the tasks that a search model (a multi-vector one's MaxSim) may score
    encoder = mteb_encoder(model, pooling, cfg, device, *meta, prompts, mteb_task._support_search)
    result = mteb.evaluate(encoder, mteb_task, cache=mteb.ResultCache(results), overwrite_strategy="always",
                           encode_kwargs={"batch_size": cfg.batch_size, "show_progress_bar": False},
                           co2_tracker=False, show_progress_bar=False).task_results[0]
    main_score = mteb_task.metadata.main_score
    rows = [row(cfg, name, value=float(scores[main_score]), n=evaluated_items(mteb_task, split, scores["hf_subset"]),
                split=split, subset=scores["hf_subset"], task_type=task_type(mteb_task),
                revision=result.dataset_revision, main_score=main_score)
            for split, per_subset in result.scores.items() for scores in per_subset]
    for r in rows:
        log.info("%s %s/%s %s = %.4f (n=%s)", name, r["split"], r["subset"], main_score,
                 r["value"], r["n"])
    cut = getattr(encoder.model[0], "cut", 0)  # a static model's StaticEmbedding cuts nothing by characters
    if cut:
        log.warning("%s: %d text(s) over %s characters cut to that before tokenizing", name, cut,
                    f"{char_budget(cfg.max_length):,}")
    return Scored(rows, cut, getattr(mteb_task, "per_query", None))
