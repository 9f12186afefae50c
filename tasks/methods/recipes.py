"""The recipe registry: one record per recipe, the only place its facts are kept.

A recipe = the training view it reads (tasks/pairs.py) + a loss over a batch of (anchor, positive)
texts + its paper's defaults. The config's `recipe` choices and help text, the pairs view, the
sentence pooling, the losses and the list of recipes whose negatives span the batch are all
derived from `RECIPES`. Components come from sentence-transformers where it has a correct one
(ContrastiveTensionLossInBatchNegatives, DenoisingAutoEncoderLoss, MatryoshkaLoss); the others are
ours (tasks/methods/*). The papers' settings are in docs/methods.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import ContrastiveTensionLossInBatchNegatives, MatryoshkaLoss
from torch import nn

from tasks.methods.infonce import InfoNCELoss
from tasks.methods.mlm import MaskedLMLoss, to_device
from tasks.methods.retromae import RetroMAELoss, retromae_features
from tasks.methods.triplet import TripletInBatchLoss
from tasks.methods.tsdae import tsdae_loss

if TYPE_CHECKING:  # tasks.config derives the recipe choices from this module
    from tasks.config import TrainConfig

Pair = tuple[str, str]
View = Literal["crops", "same", "noise", "summaries"]


@dataclass
class Objective:
    loss: nn.Module  # holds the model (and any training-only decoder or head) as submodules
    collate: Callable[[list[Pair]], list[dict]]  # a batch of texts -> the loss's sentence_features


# (recipe, model, train config, encoder mask ratio, RetroMAE's decoder_visible) -> the objective
ObjectiveFn = Callable[["Recipe", SentenceTransformer, "TrainConfig", "float | None", float], Objective]


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str  # the help text of `methods[].recipe`
    view: View  # the pairs artifact it reads
    objective: ObjectiveFn
    pooling: Literal["mean", "cls", "sep"] = "mean"  # the paper's sentence vector
    head: Literal["none", "mlp"] = "none"  # projection head used in training only
    mask_ratio: float | None = None  # encoder masking ratio, for recipes that mask
    # The loss compares sentence vectors across the rows of a batch, so every other row is a
    # negative: under DDP the vectors must be gathered from all processes.
    in_batch_negatives: bool = False
    # A projection head and Matryoshka dimensions apply (the loss is on the sentence vector alone).
    sentence_head: bool = False

    @property
    def needs_summaries(self) -> bool:
        return self.view == "summaries"


def tokens(model: SentenceTransformer, texts: list[str]) -> dict:
    return to_device(model.preprocess(texts), model.device)


def anchors_and_positives(model: SentenceTransformer) -> Callable[[list[Pair]], list[dict]]:
    # Two passes, as sentence-transformers does: one pass over 2B rows was 25% slower on CPU.
    return lambda batch: [tokens(model, [a for a, _ in batch]), tokens(model, [p for _, p in batch])]


def info_nce(one_pass: bool) -> ObjectiveFn:
    def objective(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
        loss = InfoNCELoss(model, cfg.temperature, cfg.head or recipe.head, one_pass)
        if cfg.matryoshka_dims:
            loss = MatryoshkaLoss(model, loss, sorted(cfg.matryoshka_dims, reverse=True))
        if one_pass:  # 2B rows: anchors, then positives; each row gets its own dropout mask
            return Objective(loss, lambda batch: [tokens(model, [a for a, _ in batch] + [p for _, p in batch])])
        return Objective(loss, anchors_and_positives(model))
    return objective


def semcse_triplet(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
    # (anchor summary, positive): the other rows' positives are the negatives
    return Objective(TripletInBatchLoss(model, cfg.margin, cfg.l2_weight), anchors_and_positives(model))


def semcse_info_nce(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
    return Objective(InfoNCELoss(model, cfg.temperature, "none", False), anchors_and_positives(model))


def contrastive_tension(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
    # Two copies of the encoder embed the same sentence; the one passed in is kept.
    return Objective(ContrastiveTensionLossInBatchNegatives(model, scale=1 / cfg.temperature),
                     lambda batch: [tokens(model, [a for a, _ in batch])])


def tsdae(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
    return Objective(tsdae_loss(model), anchors_and_positives(model))  # (noisy input, original)


def masked_lm(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
    # The MLM and RetroMAE losses move their own inputs to the device.
    return Objective(MaskedLMLoss(model, mask_ratio), lambda batch: [model.preprocess([a for a, _ in batch])])


def retromae(with_infonce: bool) -> ObjectiveFn:
    def objective(recipe, model, cfg, mask_ratio, decoder_visible) -> Objective:
        loss = RetroMAELoss(model, mask_ratio, decoder_visible, cfg.temperature if with_infonce else None)
        sides = (0, 1) if with_infonce else (0,)
        return Objective(loss, lambda batch: [retromae_features(model, [pair[i] for pair in batch]) for i in sides])
    return objective


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("crops", "InfoNCE on two distinct crops of a document", "crops", info_nce(False),
           in_batch_negatives=True, sentence_head=True),
    Recipe("dropout", "one crop twice, so only dropout makes the views differ (the cropping paper's baseline)",
           "same", info_nce(False), in_batch_negatives=True, sentence_head=True),
    Recipe("simcse", "unsupervised SimCSE (both views in one forward pass, CLS + MLP head)", "same",
           info_nce(True), pooling="cls", head="mlp", in_batch_negatives=True, sentence_head=True),
    Recipe("tsdae", "denoising auto-encoder: reconstruct a crop from the vector of its word-deleted copy",
           "noise", tsdae, pooling="cls"),
    Recipe("ct", "Contrastive Tension with in-batch negatives (two copies of the encoder)", "same",
           contrastive_tension, in_batch_negatives=True),
    Recipe("mlm", "masked-LM continued pre-training", "same", masked_lm, mask_ratio=0.15),
    Recipe("retromae", "RetroMAE: masked auto-encoding with enhanced decoding (whole-word masking)", "same",
           retromae(False), pooling="cls", mask_ratio=0.3),
    Recipe("retromae_infonce", "RetroMAE plus InfoNCE between two crops of one document", "crops",
           retromae(True), pooling="cls", mask_ratio=0.3, in_batch_negatives=True),
    Recipe("semcse", "triplet loss between two LLM summaries of one document (needs `summaries`)", "summaries",
           semcse_triplet, pooling="cls", in_batch_negatives=True),
    Recipe("semcse_infonce", "the same pairs with cosine InfoNCE (set `train.temperature: 0.07`, the paper's)",
           "summaries", semcse_info_nce, pooling="cls", in_batch_negatives=True),
]}


def recipe_help() -> str:
    return "; ".join(f"`{r.name}`: {r.description}" for r in RECIPES.values()) + "."


def pooling_help() -> str:
    by_pooling: dict[str, list[str]] = {}
    for r in RECIPES.values():
        by_pooling.setdefault(r.pooling, []).append(r.name)
    return "; ".join(f"{p.upper() if p != 'mean' else p} for {', '.join(names)}" for p, names in by_pooling.items())


def pooling_for(recipe: str, cfg: TrainConfig) -> str:
    return cfg.pooling or RECIPES[recipe].pooling


def build_objective(model: SentenceTransformer, recipe: str, cfg: TrainConfig, mask_ratio: float | None,
                    decoder_visible: float = 0.5) -> Objective:
    """The recipe's loss around `model`; `mask_ratio` as resolved by the method config."""
    return RECIPES[recipe].objective(RECIPES[recipe], model, cfg, mask_ratio, decoder_visible)
