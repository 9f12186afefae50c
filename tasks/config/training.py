"""How a model trains: the methods (`methods[]`) and the `train` section, merged per method.

The recipe choices, help texts and per-recipe rules are read from the recipe registry
(tasks/config/recipes.py), which holds data only and imports no config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from tasks.config.base import DEVICE_HELP, PRECISION_HELP, Device, Precision, Section
from tasks.config.families import FAMILIES, family_help
from tasks.config.family_settings import FamilySettings, MultiVectorSettings, SparseSettings
from tasks.config.recipes import CHAINS, RECIPES, pooling_help, recipe_help

GROUP_WINDOW = 50  # batches sorted by length together under `group_by_length` (the HF Trainer's megabatch)
MIN_BATCH = 2  # a batch of one row has no in-batch negatives: an epoch's trailing one is dropped


def epoch_batches(rows: int, batch_size: int, min_rows: int = MIN_BATCH) -> int:
    """The batches one epoch of `rows` pairs makes, its trailing one only with at least `min_rows` rows
    (tasks/methods/batches.py's plan_batches, which counts the same)."""
    return rows // batch_size + (rows % batch_size >= min_rows)


# `padding_free: auto` packs encoders at least this wide: on 2 CPU cores a 2-layer 256-wide BERT's crops step ran
# 1.40x faster packed and MiniLM's (384) 1.5x, while at 128 wide the packing's own index work ate the gain
# (0.96-0.99x) and at 32 wide it lost (0.87x): docs/results.md.
AUTO_MIN_HIDDEN = 256
# A compiled encoder's inputs are padded to a multiple of this many tokens: a few static shapes, each compiled
# once (docs/training.md), instead of one per batch's longest row.
COMPILE_PAD = 32
# A compiled padding-free batch is filled up to a multiple of this many tokens per row (packed.filled_tokens): a
# few static token counts, for about half of it in padding a row on average.
COMPILE_ROW_TOKENS = 8
# The recipes whose loss is a mean over rows, each on its own: no other row is a negative (group_by_length's).
PER_ROW = tuple(r.name for r in RECIPES.values() if not r.in_batch_negatives)


class MethodConfig(Section):
    name: str = Field(description="Name shown in reports, e.g. `crops`.")
    recipe: Literal[tuple(RECIPES)] = Field(description=recipe_help())
    family: Literal[tuple(FAMILIES)] = Field("dense", description=family_help())
    multi_vector: MultiVectorSettings = Field(default_factory=MultiVectorSettings,
                                              description="With `family: multi_vector`: its projection and loss.")
    sparse: SparseSettings = Field(default_factory=SparseSettings,
                                   description="With `family: sparse`: its kind (CSR, SPLADE), head and loss.")
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
    round_trip: int | None = Field(None, ge=1, description="Generated queries: train only on those whose "
                                   "passage the start model ranks within this top (default: the recipe's "
                                   "own: " + ", ".join(f"{r.round_trip} for {r.name}" for r in RECIPES.values()
                                                       if r.round_trip) + "; none for the others).")
    start_from: str | None = Field(None, description="Start from the model an earlier method of the config "
                                   "trains, instead of the base model (how a chained recipe's stages follow each "
                                   "other: " + ", ".join(f"`{c.name}`: {' then '.join(c.recipes)}"
                                                         for c in CHAINS.values()) + ").")
    knn_holdout: bool = Field(False, description="Train on the documents of the kNN train split only "
                              "(evaluate.knn's test_size and seed), so the documents kNN accuracy is "
                              "measured on are never seen in training.")
    train: dict = Field(default_factory=dict, description="Overrides of the `train` section for "
                        "this method only (e.g. `{lr: 3.0e-5, pooling: cls}`).")
    swept: dict = Field(default_factory=dict, description="Set by a `sweep` (e.g. `sweep: {lr: [1.0e-5, "
                        "2.0e-5]}` gives one method per value, each with its value here); the report draws "
                        "kNN accuracy against it.")
    sweep_of: str | None = Field(None, description="Set by a `sweep`: the name of the swept method, which "
                                 "`--methods` takes for every value of its sweep.")

    @property
    def resolved_mask_ratio(self) -> float | None:
        """The masking ratio the recipe trains with: the configured one, else the recipe's own
        (None for recipes that do not mask)."""
        return (self.mask_ratio or RECIPES[self.recipe].mask_ratio) if RECIPES[self.recipe].mask_ratio else None

    @property
    def resolved_round_trip(self) -> int | None:
        """The round-trip filter of a recipe that reads generated queries (None: every query)."""
        return (self.round_trip or RECIPES[self.recipe].round_trip) if RECIPES[self.recipe].needs_queries else None

    @property
    def resolved_decoder_visible(self) -> float | None:
        """`decoder_visible` for recipes with RetroMAE's enhanced decoder, else None."""
        return self.decoder_visible if RECIPES[self.recipe].enhanced_decoder else None

    @property
    def family_settings(self) -> FamilySettings | None:
        """The settings of the family the method trains (its own section, named as the family), None for dense."""
        return None if self.family == "dense" else getattr(self, self.family)

    @model_validator(mode="after")
    def _replacement_rates(self) -> MethodConfig:
        if self.title_rate + self.sentence_rate > 1:
            raise ValueError("title_rate + sentence_rate must not exceed 1")
        return self

    @model_validator(mode="after")
    def _family_recipe(self) -> MethodConfig:
        for other in set(FAMILIES) - {"dense", self.family}:
            if other in self.model_fields_set:
                raise ValueError(f"{other}: settings of the {other} family on a {self.family} method; set "
                                 f"`family: {other}` or leave them out")
        family = FAMILIES[self.family]
        if family.recipes is not None and self.recipe not in family.recipes:
            raise ValueError(f"recipe {self.recipe} cannot train the {self.family} family: its loss is not an "
                             f"InfoNCE over (query, document) rows; {self.family} trains "
                             f"{', '.join(sorted(family.recipes))}")
        return self


class LoraSettings(Section):
    """Low-rank adapters (LoRA, through peft) instead of training every weight: LLM2Vec's way with decoders."""

    r: int = Field(16, ge=1, description="Rank of each adapter (LLM2Vec: 16).")
    alpha: float = Field(32, gt=0, description="Scale of the adapters' update: alpha / r times it (LLM2Vec: 2r).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapters' input (LLM2Vec: 0.05).")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="The linear layers that get an adapter, by name (e.g. [q_proj, v_proj]); "
        "`all-linear`: every linear layer of the transformer blocks (a Llama's seven projections, as LLM2Vec).")


class TrainConfig(Section):
    epochs: int = Field(1, ge=1, description="Passes over the documents (one pair per document each).")
    max_steps: int | None = Field(None, ge=1, description="Cut the schedule to this many steps (the epochs must "
                                  "make at least as many batches): one length for recipes whose views differ in "
                                  "rows, as `embforge select` trains them. None: every batch of the epochs.")
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
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the gradients' total norm to this before "
                                        "each step (1.0, as the Hugging Face and sentence-transformers trainers; "
                                        "a step under it is unchanged); null turns clipping off.")
    on_unhealthy: Literal["stop", "warn"] = Field(
        "stop", exclude=True, description="What a collapse or divergence found during training does "
        "(docs/health.md): `stop` the stage with one error naming the step, loss and lr; `warn` and finish "
        "(the report's health rows say so). It changes no number of a healthy run, so it is not part of the key.")
    checkpoint_every: int = Field(20, ge=1, description="Save a resumable checkpoint every N steps.")
    eval_every: int | None = Field(None, ge=1, description="Measure kNN accuracy on the labelled "
                                   "documents every N steps and after the last (the papers' learning "
                                   "curves, in training.parquet); needs `evaluate.knn` and labels.")
    seed: int = Field(0, description="Seed of the dropout masks during training (and of the order of "
                      "group_by_length's batches).")
    device: Device = Field("auto", description=DEVICE_HELP)
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
    padding_free: bool | Literal["auto"] = Field(
        "auto", description="Compute the encoder's linear layers on the batch's real tokens only (BERT encoders; "
        "tasks/encoders/packed.py): the same model, faster by the batch's share of padding. `auto`: on a CPU with a "
        f"BERT encoder {AUTO_MIN_HIDDEN} wide or wider, where that is the step's arithmetic; off on a GPU, where the "
        "packing's extra kernels made a step slower, for narrower encoders, and for other encoder types. `true` "
        "refuses other encoders. With `compile`, the packed tokens are filled up to a multiple of "
        f"{COMPILE_ROW_TOKENS} a row: a few static shapes. Dropout draws other masks, so it is part of the key.")
    group_by_length: bool = Field(False, description="Recipes whose loss is per row (" + ", ".join(PER_ROW) + "): "
                                  f"sort each window of {GROUP_WINDOW} batches by tokens before cutting it into "
                                  "batches, which then come in a seeded random order, so a batch pads little (as the "
                                  "Hugging Face Trainer's group_by_length). Other recipes' batches are their "
                                  "negatives: refused there.")
    compile: bool | Literal["cuda_graphs"] = Field(
        False, description="torch.compile the encoder for static shapes (inputs padded to a multiple of "
        f"{COMPILE_PAD} tokens): fewer, fused kernels, which a GPU runs launch-bound at these sizes otherwise. Each "
        "shape's first step pays for compiling it. `cuda_graphs`: also record the kernels of each encoder call of a "
        "step (its place and shape) once and replay them (torch.compile's `reduce-overhead`), for batches too small "
        "to keep a GPU busy; on a CPU it is `true`. "
        "Dropout draws other masks, so it is part of the key.")
    bidirectional: bool | None = Field(
        None, description="Decoder models: train with bidirectional attention (true) or the causal attention they "
        "were made with (false); the trained model keeps it. Default: bidirectional for the recipes that need it (" +
        ", ".join(r.name for r in RECIPES.values() if r.decoder_only) + "), else the start model's own.")
    dropout: float | None = Field(None, ge=0, lt=1, description="Set every dropout probability of the model's "
                                  "config to this for training (default: the model's own). Decoders have none, "
                                  "which leaves dropout views identical: LLM2Vec's SimCSE stage trains with 0.3.")
    lora: LoraSettings | None = Field(None, description="Train low-rank adapters (peft's LoRA) and keep every weight "
                                     "of the model fixed: the train artifact holds the adapter (a few MB), and the "
                                     "`merge` stage the model with it added in, which is evaluated and exported; "
                                     "`lora: {}` takes LLM2Vec's settings.")
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

    @property
    def min_batch_rows(self) -> int:
        """The fewest rows a batch trains on; an epoch's trailing batch of fewer is dropped. In one process
        MIN_BATCH; with `devices` other than 1 a full batch, so that every process holds rows of every batch whatever
        their number (`auto`'s too), and the pairs stage, which counts a budget's epochs, counts the same batches."""
        return MIN_BATCH if self.devices == 1 else self.batch_size

    @model_validator(mode="after")
    def _rows_for_every_process(self) -> TrainConfig:
        if isinstance(self.devices, int) and self.devices > self.batch_size:
            raise ValueError(f"devices: {self.devices} processes share each batch of batch_size {self.batch_size} "
                             "rows, so some would hold none: at most batch_size devices")
        return self

    @model_validator(mode="after")
    def _compiled_lengths(self) -> TrainConfig:
        if self.compile and self.max_length % COMPILE_PAD:
            raise ValueError(f"compile: {str(self.compile).lower()} pads inputs to a multiple of {COMPILE_PAD} tokens, "
                             f"so max_length must be one, not {self.max_length} "
                             f"(e.g. {-(-self.max_length // COMPILE_PAD) * COMPILE_PAD})")
        return self


def family_conflicts(family: str, train: TrainConfig, settings: FamilySettings | None = None) -> list[str]:
    """The `train` settings a family other than dense (`settings`: its section) does not train with (yet), each as
    `field (why)`."""
    splade = isinstance(settings, SparseSettings) and settings.kind == "splade"
    conflicts = {
        "head": (train.head == "mlp", "a projection head on the dense vector; the family has a head of its own"),
        "pooling": ((family == "multi_vector" or splade) and train.pooling is not None,
                    "SPLADE takes each term's maximum over the tokens" if splade else
                    "a multi-vector model keeps every token; its one vector is their mean"),
        "matryoshka_dims": (bool(train.matryoshka_dims), "nested dense-vector widths"),
        "mini_batch_size": (family == "sparse" and not splade and train.cached_rows is not None,
                            "CSR's loss also rebuilds each vector, which sentence-transformers does not cache"),
        "padding_free": (train.padding_free is True, "its packed forward is built for the dense model"),
        "compile": (bool(train.compile), "not built for the family's head yet"),
        "lora": (train.lora is not None, "the merge stage rebuilds a dense model"),
    }
    return [f"{name} ({why})" for name, (found, why) in conflicts.items() if found]


def expand_sweeps(methods: list) -> list:
    """Each method with a `sweep` ({field: [values]}, fields of the method or of `train`) becomes one
    method per combination of values, named `<name>-<field>-<value>`, each trained and cached on its own."""
    expanded = []
    for i, method in enumerate(methods):
        if not isinstance(method, dict) or "sweep" not in method:
            expanded.append(method)
            continue
        base, sweep = {k: v for k, v in method.items() if k != "sweep"}, method["sweep"]
        if not isinstance(sweep, dict) or not sweep:
            raise ValueError(f"methods.{i}.sweep: a mapping of a field to its values, e.g. {{lr: [1.0e-5, 2.0e-5]}}")
        combos: list[dict] = [{}]
        for field, values in sweep.items():
            if field not in SWEEPABLE:
                raise ValueError(f"methods.{i}.sweep.{field}: not a field of a method or of `train`")
            if not isinstance(values, list) or not values:
                raise ValueError(f"methods.{i}.sweep.{field}: a list of values")
            combos = [{**c, field: v} for c in combos for v in values]
        for combo in combos:
            name = "-".join([str(base.get("name")), *(f"{f}-{v}" for f, v in combo.items())])
            train = {**base.get("train", {}), **{f: v for f, v in combo.items() if f in TrainConfig.model_fields}}
            expanded.append({**base, **{f: v for f, v in combo.items() if f in MethodConfig.model_fields},
                             "name": name, "train": train, "swept": combo, "sweep_of": base.get("name")})
    return expanded


SWEEPABLE = (set(TrainConfig.model_fields) | set(MethodConfig.model_fields)) - {"name", "recipe", "train", "swept",
                                                                                 "sweep_of", "start_from"}


def expand_chains(methods: list) -> list:
    """A method of a chained recipe (CHAINS: llm2vec) becomes one method per stage, each starting from the model of
    the stage before (`start_from`): the last keeps the method's name (and a sweep's value), the others are named
    `<name>-<recipe>`. Each stage's `train` is the chain's defaults, then the method's `train`, then the method's
    `stages: {<recipe>: {...}}` for that stage (LLM2Vec trains MNTP and SimCSE at other batch sizes and lengths)."""
    expanded = []
    for i, method in enumerate(methods):
        chain = CHAINS.get(method.get("recipe")) if isinstance(method, dict) else None
        if chain is None:
            expanded.append(method)
            continue
        own = method.get("stages", {})
        if set(own) - set(chain.recipes):
            raise ValueError(f"methods.{i}.stages: {sorted(own)}: the stages of {chain.name} are {chain.recipes}")
        before = method.get("start_from")
        for j, (recipe, defaults) in enumerate(chain.stages):
            train = {**defaults, **method.get("train", {}), **own.get(recipe, {})}
            stage = {**{k: v for k, v in method.items() if k != "stages"}, "recipe": recipe, "train": train,
                     "start_from": before}
            if j < len(chain.stages) - 1:
                stage = {k: v for k, v in stage.items() if k not in ("swept", "sweep_of")}
                stage["name"] = f"{method.get('name')}-{recipe}"
            expanded.append(stage)
            before = stage["name"]
    return expanded


def merged_train(base: TrainConfig, method: MethodConfig, where: str) -> TrainConfig:
    try:
        cfg = TrainConfig.model_validate({**dict(base), **method.train})  # dict: the fields kept out of the key too
    except ValidationError as e:
        raise ValueError("; ".join(".".join([where, *map(str, err["loc"])]) + f": {err['msg']}"  # loc (): a model check
                                   for err in e.errors())) from None
    if not RECIPES[method.recipe].sentence_head and (cfg.head == "mlp" or cfg.matryoshka_dims):
        with_head = tuple(r.name for r in RECIPES.values() if r.sentence_head)
        raise ValueError(f"{where}: head and matryoshka_dims apply to the recipes {with_head}, "
                         f"not to {method.recipe!r}")
    if cfg.group_by_length and method.recipe not in PER_ROW:
        raise ValueError(f"{where}: group_by_length applies to the recipes whose loss is per row {PER_ROW}, not to "
                         f"{method.recipe!r}, which learns from the other rows of its batch")
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


def bidirectional_for(recipe: str, cfg: TrainConfig) -> bool | None:
    """A decoder's attention in training: the configured one, else bidirectional for the recipes that need it,
    else None (as the start model was saved)."""
    return cfg.bidirectional if cfg.bidirectional is not None else (True if RECIPES[recipe].decoder_only else None)


def pooling_for(recipe: str, cfg: TrainConfig) -> str:
    """The sentence vector a method uses: the configured pooling, else its recipe's own."""
    return cfg.pooling or RECIPES[recipe].pooling
