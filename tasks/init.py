"""Init: a randomly initialised BERT encoder (or Llama decoder) with a pre-trained tokenizer, for from-scratch runs.

Output: `model/` (sentence-transformers format, mean pooling).
"""

from __future__ import annotations

import logging

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.model import ModelConfig, RandomInitConfig
from tasks.core.stage import NoInputs, Stage
from tasks.encoders.models import model_identity, save_random_encoder


class InitConfig(RandomInitConfig):
    """Identity of a randomly initialised encoder (see ModelConfig.random_init)."""

    tokenizer: str

    @classmethod
    def from_model(cls, cfg: ModelConfig) -> InitConfig:
        return cls(tokenizer=cfg.name_or_path, **cfg.random_init.model_dump())


def build_init(store: ArtifactStore, cfg: InitConfig, inputs: NoInputs,
               out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    save_random_encoder(cfg.tokenizer, cfg, out.folder / "model")
    log.info("random %s model, %d layers x %d hidden", cfg.architecture, cfg.layers, cfg.hidden)


INIT = Stage("init", build_init, extra_key=lambda cfg: model_identity(cfg.tokenizer), seeds_global_rng=True)
