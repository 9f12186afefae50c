"""What is measured (`evaluate`): kNN, STS, geometry, the semantic benchmark and MTEB tasks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.config.base import DEVICE_HELP, PRECISION_HELP, Device, Precision, Section
from tasks.config.splits import HeldOutShare, KnnConfig
from tasks.config.yardsticks import KINDS, MIN_POOL, YARDSTICKS


class StsConfig(Section):
    path: str = Field(description="Parquet of sentence pairs: sentence1, sentence2, score (+ split).")
    split: str | None = Field("test", description="Rows of this `split` only (None: all rows).")


# The cropping paper's MTEB subset (docs/methods.md §1): task name → block of the block average.
PAPER_MTEB_TASKS = {
    "ArxivClusteringP2P": "clustering", "BiorxivClusteringP2P": "clustering",
    "MedrxivClusteringP2P": "clustering", "RedditClusteringP2P": "clustering",
    "StackExchangeClusteringP2P": "clustering", "SciDocsRR": "reranking", "MindSmallReranking": "reranking",
    "SCIDOCS": "retrieval", "ArguAna": "retrieval", "STS15": "sts", "STS16": "sts", "STSBenchmark": "sts",
}


# A trial run (`limit` set) with no `corpus_limit` encodes about this many documents of a retrieval corpus.
MAX_TRIAL_CORPUS = 10_000


class LocalTaskConfig(Section):
    """An MTEB task built from a local Parquet file, so it runs offline."""

    name: str = Field(description="Task name shown in reports (e.g. `STSB-local`).")
    type: Literal["clustering", "sts", "retrieval", "pair_classification"] = Field(
        description="`clustering`: documents (text, label); `sts`: pairs (sentence1, sentence2, score); "
        "`retrieval`: a corpus (doc_id, title, text) plus `queries`; `pair_classification`: pairs "
        "whose score decides the label (see `positive_at`).")
    path: str = Field(description="Parquet file (relative to the config file's folder).")
    queries: str | None = Field(None, description="Retrieval only: Parquet with query_id, query, doc_id "
                                "(a relevant document) and score.")
    split: str | None = Field("test", description="Use rows of this `split` only (None: all rows).")
    limit: int | None = Field(None, gt=0, description="Use only the first N pairs, documents or queries.")
    corpus_limit: int | None = Field(None, gt=0, description="Retrieval only: encode about N documents of the "
                                     "corpus: every one relevant to a query kept (even past N) and a seeded sample of "
                                     "the others up to N (fewer distractors make retrieval easier: for trial runs). "
                                     f"Unset: the whole corpus, or {MAX_TRIAL_CORPUS:,} documents when `limit` is set.")
    positive_at: float = Field(0.5, description="Pair classification: score ≥ this is a positive "
                               "(paraphrase), below it a negative.")

    @model_validator(mode="after")
    def _queries(self) -> LocalTaskConfig:
        if (self.type == "retrieval") != (self.queries is not None):
            raise ValueError("`queries` is required for retrieval tasks and only for them")
        if self.corpus_limit and self.type != "retrieval":
            raise ValueError("`corpus_limit` is for retrieval tasks only")
        return self


class MtebSettings(Section):
    """How a model is encoded for MTEB: shared by the config's `evaluate.mteb` and each mteb job."""

    max_length: int = Field(384, ge=8, description="Truncate texts to this many tokens (the paper: 384).")
    batch_size: int = Field(32, ge=1, description="Texts per encoding batch.")
    dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description="Weights' dtype.")


class MtebConfig(MtebSettings):
    tasks: list[str] = Field(default_factory=list, description="MTEB task names whose data comes from "
                             "the Hub (or a local Hub cache); `paper` expands to the cropping paper's 12. "
                             "Tasks whose data is not reachable are reported as skipped.")
    local: list[LocalTaskConfig] = Field(default_factory=list, description="Tasks built from local Parquet files.")

    @property
    def settings(self) -> MtebSettings:
        return MtebSettings(**self.model_dump(include=set(MtebSettings.model_fields)))

    @property
    def task_names(self) -> list[str]:
        names = [n for t in self.tasks for n in (PAPER_MTEB_TASKS if t == "paper" else [t])]
        return list(dict.fromkeys(names))


class SemanticConfig(Section):
    """SemCSE's semantic benchmark (docs/methods.md §5)."""

    limit: int | None = Field(1000, gt=0, description="Rank among the first N documents (None: all).")
    k: int = Field(5, ge=1, description="Neighbours of the same-label proportion.")


StoreDtype = Literal["float32", "float16"]
Backend = Literal["torch", "onnx", "openvino"]  # tasks/encoders/backends.py
TSNE_MAX = 5000


class YardstickConfig(HeldOutShare):
    """A held-out share of the corpus made into a retrieval task that no training sees (tasks/yardstick.py)."""

    kind: Literal[("auto", *KINDS)] = Field(
        "auto", description="What the held-out documents ask (tasks/config/yardsticks.py): `qrels` (your queries and "
        "the documents relevant to each, `qrels`) find them among the corpus's; `labels` (the corpus's label column): "
        "each held-out document finds documents of its label among the others; `titles`: each held-out document's "
        "title finds its text; `queries`: queries an LLM writes for each held-out document (`queries.llm`, the "
        "offline default otherwise) find it; `consensus`: the titles' or LLM's queries, each candidate scored "
        "against the others' rankings fused (leave-one-out); `neighbours`: each held-out document asks by its own "
        "vector for its nearest other documents, scored as a consensus; `clusters`: every document's 10 nearest "
        "others, by the share in its group of the other candidates' k-means grouping; `auto`: qrels where given, else "
        "labels, "
        "unless fewer held-out documents ask by label than half those that would by title (else all held out), else "
        "titles, else the clusters (the neighbours where too few documents to group; an LLM's queries where fewer than "
        f"{MIN_POOL} models are ranked: too few to judge each other).")
    qrels: str | None = Field(None, description="Parquet of your queries: query_id, query, doc_id, score (one row "
                              "per query and relevant document; score > 0 is relevant), the format of a local MTEB "
                              "retrieval task's `queries`. Read by `kind: qrels` or `auto`.")
    max_queries: int | None = Field(1000, ge=2, description="At most this many queries ask, a sample drawn by a hash "
                                    "of (seed, query id); the other held-out documents stay out of training. A "
                                    "paired interval over a thousand is narrow, and each query costs an embedding "
                                    "and a ranking at every rung. None: all. (The clusters ask with every "
                                    "document: `select.sample` bounds them.)")

    @model_validator(mode="after")
    def _qrels_with_its_kind(self) -> YardstickConfig:
        if self.kind == "qrels" and not self.qrels:
            raise ValueError("kind: qrels needs `qrels`, the Parquet file of your queries and their relevant "
                             "documents")
        if self.qrels and self.kind not in ("auto", "qrels"):
            raise ValueError(f"`qrels` is read by kind qrels or auto, not {self.kind}")
        return self


class MaxSimSearch(Section):
    """How a multi-vector model's queries search its documents (docs/families.md, its index)."""

    exact_up_to: int = Field(10_000, ge=0, description="Up to this many documents every query is scored against "
                             "every document by exact MaxSim; past it through an index (faiss, inverted lists of "
                             "8-bit token vectors): each query token's `nearest` document tokens name the candidate "
                             "documents, and only those are scored by exact MaxSim (ColBERT's end-to-end retrieval).")
    nearest: int = Field(128, ge=1, description="Document token vectors the index returns for each query token.")
    probes: int = Field(32, ge=1, description="Inverted lists the index visits for each query token.")


# By the yardstick's kind: the mean of its nDCG@10, the score `embforge select` ranks by.
YARDSTICK_METRICS = {kind: y.metric for kind, y in YARDSTICKS.items()}


class EvaluateConfig(Section):
    max_length: int = Field(256, ge=8, description="Truncate evaluated texts to this many tokens.")
    batch_size: int = Field(32, ge=1, description="Texts per encoding batch.")
    knn: KnnConfig | None = Field(default_factory=KnnConfig, description="kNN accuracy (docs/methods.md §1).")
    sts: StsConfig | None = Field(None, description="STS Spearman correlation of cosine similarities.")
    layerwise: bool = Field(False, description="kNN accuracy on every hidden layer (0 = embedding "
                            "layer) with mean, CLS and SEP pooling: the layer-wise curves.")
    geometry: bool = Field(True, description="Alignment (STS pairs scored ≥ 4), uniformity, mean cosine "
                           "of random pairs and the variance share of the top principal components.")
    tsne: bool = Field(True, description="A t-SNE map of the labelled documents per model (PNG).")
    tsne_max: int = Field(TSNE_MAX, ge=2, description="t-SNE maps at most this many labelled documents, a "
                          "seeded sample (its memory grows with the documents mapped); the picture and "
                          "the report say when it sampled.")
    store_dtype: StoreDtype = Field("float32", description="How the embeddings cache stores vectors: "
                                    "`float16` halves its disk and reading memory; every metric still "
                                    "computes in float32 or float64.")
    semantic: SemanticConfig | None = Field(None, description="SemCSE's semantic benchmark: average rank "
                                            "of title↔abstract, half↔half and summary↔paper (with "
                                            "`summaries`), and the k-NN same-label proportion.")
    mteb: MtebConfig | None = Field(None, description="MTEB tasks, from the Hub or from local files.")
    yardstick: YardstickConfig | None = Field(
        None, description="A held-out share of the documents, left out of every method's training, as a retrieval "
        "task: by your queries (qrels_ndcg_at_10, qrels_mrr_at_10), their labels (label_ndcg_at_10, "
        "label_mrr_at_10), their titles (title_ndcg_at_10, title_mrr_at_10, title_recall_at_10) or an LLM's "
        "queries (generated_ndcg_at_10, ...), paired between models in the report.")
    maxsim: MaxSimSearch = Field(default_factory=MaxSimSearch, description="A multi-vector model's retrieval: exact "
                                 "MaxSim over every document, or past a corpus size through an index.")
    latency_queries: int = Field(64, ge=0, description="Where the models are of more than one family: the held-out "
                                 "queries (the yardstick's texts, else the generated ones) each model answers one at "
                                 "a time on the CPU, the models in turn, for the report's query latency (0: none).")
    reference_models: list[str] = Field(
        default_factory=list, description="Extra models evaluated next to the trained ones, untrained "
        "(e.g. a pre-trained sentence model as a yardstick).")
    device: Device = Field("auto", description=DEVICE_HELP)
    dtype: Precision = Field("auto", description="Autocast precision of encoding. " + PRECISION_HELP)
    backend: Backend = Field("torch", description="What encodes for the embeddings cache: torch, or the "
                             "model exported to ONNX and run by ONNX Runtime (`onnx`, fp32) or OpenVINO "
                             "(`openvino`, fp32 or bf16) on the CPU: the same scores, faster on a CPU. "
                             "The exported backends give the last layer only (no `layerwise`).")

    @model_validator(mode="after")
    def _backend_can_encode(self) -> EvaluateConfig:
        if self.backend != "torch" and self.layerwise:
            raise ValueError(f"backend: {self.backend} gives the last layer only; `layerwise` needs every "
                             "hidden layer, use backend: torch")
        if self.backend == "onnx" and self.dtype not in ("auto", "fp32"):
            raise ValueError(f"backend: onnx encodes in fp32 on a CPU, not dtype {self.dtype}; use "
                             "backend: openvino for bf16")
        if self.backend != "torch" and self.device.startswith("cuda"):
            raise ValueError(f"backend: {self.backend} runs on the CPU, not device {self.device}; use "
                             "backend: torch on a GPU")
        return self
