"""Each recipe = the view it reads + a loss over a batch of (anchor, positive) texts.

`build_objective` is the one place that knows which loss and which tokenisation a recipe uses;
the training loop, the pipeline and the stages are the same for every recipe. Components come
from sentence-transformers where it has a correct one (ContrastiveTensionLossInBatchNegatives,
DenoisingAutoEncoderLoss, MatryoshkaLoss); the others are ours (tasks/methods/*).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import (
    ContrastiveTensionLossInBatchNegatives, MatryoshkaLoss)
from torch import nn

from tasks.config import TrainConfig, mask_ratio_for
from tasks.methods.infonce import InfoNCELoss
from tasks.methods.mlm import MaskedLMLoss, to_device
from tasks.methods.retromae import RetroMAELoss, retromae_features
from tasks.methods.triplet import TripletInBatchLoss
from tasks.methods.tsdae import tsdae_loss

Pair = tuple[str, str]

# The papers' sentence vectors: CLS for SimCSE, TSDAE, RetroMAE and SemCSE, mean pooling for the others.
DEFAULT_POOLING = {r: "cls" for r in ("simcse", "tsdae", "retromae", "retromae_infonce", "semcse", "semcse_infonce")}


def pooling_for(recipe: str, cfg: TrainConfig) -> str:
    return cfg.pooling or DEFAULT_POOLING.get(recipe, "mean")


def head_for(recipe: str, cfg: TrainConfig) -> str:
    return cfg.head or ("mlp" if recipe == "simcse" else "none")


@dataclass
class Objective:
    loss: nn.Module  # holds the model (and any training-only decoder or head) as submodules
    collate: Callable[[list[Pair]], list[dict]]  # a batch of texts -> the loss's sentence_features


def build_objective(model: SentenceTransformer, recipe: str, cfg: TrainConfig, mask_ratio: float | None = None,
                    decoder_visible: float = 0.5) -> Objective:
    """`mask_ratio` None: the recipe's own (see `mask_ratio_for`)."""
    mask_ratio = mask_ratio_for(recipe, mask_ratio)

    def tokens(texts: list[str]) -> dict:
        return to_device(model.preprocess(texts), model.device)

    def anchors_and_positives(batch: list[Pair]) -> list[dict]:
        # Two passes, as sentence-transformers does: one pass over 2B rows was 25% slower on CPU.
        return [tokens([a for a, _ in batch]), tokens([p for _, p in batch])]

    def anchors_only(batch: list[Pair]) -> list[dict]:
        return [tokens([a for a, _ in batch])]

    if recipe in ("crops", "dropout", "simcse"):
        one_pass = recipe == "simcse"
        loss = InfoNCELoss(model, cfg.temperature, head_for(recipe, cfg), one_pass)
        if cfg.matryoshka_dims:
            loss = MatryoshkaLoss(model, loss, sorted(cfg.matryoshka_dims, reverse=True))
        if one_pass:  # 2B rows: anchors, then positives; each row gets its own dropout mask
            return Objective(loss, lambda batch: [tokens([a for a, _ in batch] + [p for _, p in batch])])
        return Objective(loss, anchors_and_positives)
    if recipe == "semcse":  # (anchor summary, positive): the other rows' positives are the negatives
        return Objective(TripletInBatchLoss(model, cfg.margin, cfg.l2_weight), anchors_and_positives)
    if recipe == "semcse_infonce":
        return Objective(InfoNCELoss(model, cfg.temperature, "none", False), anchors_and_positives)
    if recipe == "ct":
        # Two copies of the encoder embed the same sentence; the one passed in is kept.
        return Objective(ContrastiveTensionLossInBatchNegatives(model, scale=1 / cfg.temperature), anchors_only)
    if recipe == "tsdae":
        return Objective(tsdae_loss(model), anchors_and_positives)  # (noisy input, original)
    if recipe == "mlm":  # the MLM and RetroMAE losses move their own inputs
        return Objective(MaskedLMLoss(model, mask_ratio), lambda batch: [model.preprocess([a for a, _ in batch])])
    if recipe in ("retromae", "retromae_infonce"):
        with_infonce = recipe == "retromae_infonce"
        loss = RetroMAELoss(model, mask_ratio, decoder_visible, cfg.temperature if with_infonce else None)

        def collate(batch: list[Pair]) -> list[dict]:
            sides = (0, 1) if with_infonce else (0,)
            return [retromae_features(model, [pair[i] for pair in batch]) for i in sides]

        return Objective(loss, collate)
    raise ValueError(f"unknown recipe {recipe!r}")
