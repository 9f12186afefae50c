"""Low-rank adapters (LoRA) through peft: attached for training, saved alone, merged into the base for use.

An adapter trains a pair of small matrices beside each chosen linear layer and leaves the model's own weights as
they are, so the optimiser holds a fraction of the state and the saved artifact is a few MB. Training attaches one
with transformers' own adapter interface (the model keeps its class: freezing, pooling and the losses see the same
modules); the saved folder has the adapter, the model's config (its attention and dropout as trained: transformers
saves no config beside an adapter) and the sentence-transformers files. `merge_adapter` adds the adapter into the
base model's weights: a plain model folder that every stage loads as any other.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel
from sentence_transformers import SentenceTransformer
from transformers import AutoConfig, AutoModel

from tasks.config.base import InputError
from tasks.config.training import LoraSettings
from tasks.encoders.models import load_model, start_config

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def linear_layers(module: torch.nn.Module) -> set[str]:
    return {name for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def check_targets(linear: set[str], targets: list[str] | str, model: str) -> None:
    """Every `train.lora.target_modules` name must end some linear layer's name (peft's rule), else one InputError
    naming the setting and the layers there are: a config mistake, never retried as a fault."""
    if targets == "all-linear":
        return
    if missing := [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in linear)]:
        names = sorted({n.rsplit(".", 1)[-1] for n in linear})
        raise InputError(f"train.lora.target_modules: {missing} match no linear layer of {model}; its linear layers "
                         f"are named {names} (or use all-linear)")


def start_layers(name_or_path: str) -> set[str] | None:
    """A named model's linear layers, built on the meta device from its config (no weights read); None where the
    config cannot be read before a stage runs (a GGUF decoder, converted first; a Hub name offline)."""
    if (config := start_config(name_or_path)) is None:
        return None
    with torch.device("meta"):
        return linear_layers(AutoModel.from_config(config))


def attach_lora(model: SentenceTransformer, cfg: LoraSettings, seed: int) -> None:
    """A fresh adapter on the model's linear layers, drawn from `seed` (not from whatever the process drew before);
    only the adapter's weights train from here on."""
    check_targets(linear_layers(model.transformers_model), cfg.target_modules,
                  model.transformers_model.config.name_or_path or "the model")
    torch.manual_seed(seed)
    model.transformers_model.add_adapter(LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                                    target_modules=cfg.target_modules, bias="none"))


def has_adapter(model: SentenceTransformer) -> bool:
    return getattr(model.transformers_model, "_hf_peft_config_loaded", False)


def save_with_adapter(model: SentenceTransformer, folder: Path) -> None:
    """The model's folder as sentence-transformers saves it (an adapted model: its adapter's weights only), and
    the model's config beside them."""
    model.save(str(folder))
    if has_adapter(model):
        model.transformers_model.config.save_pretrained(folder)


def merge_adapter(base: str, adapter: Path, out: Path, dtype: torch.dtype = torch.float32) -> None:
    """`base` (a model folder or name) with the adapter in `adapter` added into its weights, saved in `out` with
    the adapter folder's config, tokenizer and sentence-transformers files."""
    shutil.copytree(adapter, out, ignore=shutil.ignore_patterns(*ADAPTER_FILES))
    config = AutoConfig.from_pretrained(adapter)  # the attention and dropout it trained with
    model = load_model(base, lambda p: AutoModel.from_pretrained(p, config=config, dtype=torch.float32))
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.to(dtype).save_pretrained(out)
