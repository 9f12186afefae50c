"""The loss of every recipe in the registry (tasks/config/recipes.py), and its collate function.

Kept apart from the registry so that the config and the data stages do not import (and so do not
depend on) the losses: a stage's identity follows its imports. `OBJECTIVES` must name exactly the
registry's recipes; importing this module checks it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from sentence_transformers import MultiVectorEncoder, SentenceTransformer
from sentence_transformers.base.losses import column_merging_disabled
from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss
from sentence_transformers.sentence_transformer.losses import MarginMSELoss, MatryoshkaLoss
from sentence_transformers.sparse_encoder import SparseEncoder
from sentence_transformers.sparse_encoder.losses import CSRLoss, SparseMultipleNegativesRankingLoss, SpladeLoss
from torch import nn

from tasks.config.family_settings import FamilySettings, MultiVectorSettings, SparseSettings
from tasks.config.recipes import RECIPES, Pair, Recipe
from tasks.config.training import TrainConfig
from tasks.encoders.inputs import Tokens, features
from tasks.encoders.models import to_device
from tasks.methods.cached import CachedLoss, CachedMaxSimLoss, CachedSpladeLoss
from tasks.methods.contrastive_tension import GatheredContrastiveTensionLoss
from tasks.methods.distributed import Gather, gather_rows, gather_tokens, no_gather, world
from tasks.methods.infonce import InfoNCELoss
from tasks.methods.mlm import MaskedLMLoss
from tasks.methods.mntp import MaskedNextTokenLoss
from tasks.methods.retromae import RetroMAELoss, retromae_features
from tasks.methods.summed import SummedLoss
from tasks.methods.triplet import TripletInBatchLoss
from tasks.methods.tsdae import tsdae_loss


@dataclass
class Objective:
    loss: nn.Module  # holds the model (and any training-only decoder or head) as submodules
    collate: Callable[[list[Pair]], list[dict]]  # a batch of texts -> the loss's sentence_features
    # batch size -> the loss of a model that gives every text one vector (a softmax over the batch's
    # rows: ln(batch)); None for losses without such a level (tasks/methods/health.py)
    chance: Callable[[int], float] | None = None
    labels: Callable[[list[Pair]], torch.Tensor] | None = None  # the loss's labels, where it takes any
    # (step from 0, the schedule's steps) -> None, before each step: sets the loss's scheduled weights, where it has any
    at_step: Callable[[int, int], None] | None = None
    head: nn.Module | None = None  # a masked-LM head trained beside the encoder, saved with it (mlm's: for SPLADE)


# (recipe, model, train config, encoder mask ratio, RetroMAE's decoder_visible, gather) -> the objective;
# the mask ratio and decoder_visible are None for recipes that do not use them (MethodConfig resolves
# them); `gather` collects the rows that the loss compares from every process.
ObjectiveFn = Callable[[Recipe, SentenceTransformer, TrainConfig, "float | None", "float | None", Gather], Objective]


def tokens(model: SentenceTransformer, column: list[str] | list[Tokens], task: str | None = None) -> dict:
    return to_device(features(model, column, task), model.device)


def anchors_and_positives(model: SentenceTransformer, as_queries: bool = False) -> Callable[[list[Pair]], list[dict]]:
    """One input per column: anchors, positives, and hard negatives when the rows carry them; `as_queries`: the
    anchors read as a multi-vector model's queries, the others as its documents (`features`' task).
    A pass per column, as sentence-transformers does: one pass over 2B rows was 25% slower on CPU."""
    task = lambda i: ("query" if i == 0 else "document") if as_queries else None  # noqa: E731
    return lambda batch: [tokens(model, list(column), task(i)) for i, column in enumerate(zip(*batch))]


def info_nce(one_pass: bool) -> ObjectiveFn:
    def objective(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
        loss = InfoNCELoss(model, cfg.temperature, cfg.head or recipe.head, one_pass, gather)
        terms = max(1, len(cfg.matryoshka_dims))  # Matryoshka sums one InfoNCE per dimension
        columns = 2 if recipe.hard_negatives else 1  # candidates per row: its positive, and its hard negative
        chance = lambda rows: terms * math.log(columns * rows)  # noqa: E731
        if cfg.matryoshka_dims:
            loss = MatryoshkaLoss(model, loss, sorted(cfg.matryoshka_dims, reverse=True))
        if one_pass:  # 2B rows: anchors, then positives; each row gets its own dropout mask
            return Objective(loss, lambda batch: [tokens(model, [a for a, _ in batch] + [p for _, p in batch])],
                             chance)
        return Objective(loss, anchors_and_positives(model), chance)
    return objective


def semcse_triplet(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    # (anchor summary, positive): the other rows' positives are the negatives
    return Objective(TripletInBatchLoss(model, cfg.margin, cfg.l2_weight, gather), anchors_and_positives(model))


def semcse_info_nce(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    return Objective(InfoNCELoss(model, cfg.temperature, "none", False, gather), anchors_and_positives(model),
                     math.log)


def margin_mse(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    # (query, passage, negative, margin) rows: the student's dot-product margin learns the cross-encoder's
    # (GPL). No chance level: a model with one vector for every text predicts margin 0.
    texts = anchors_and_positives(model)
    return Objective(MarginMSELoss(model), lambda batch: texts([row[:3] for row in batch]),
                     labels=lambda batch: torch.tensor([row[3] for row in batch], dtype=torch.float32))


def contrastive_tension(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    # Two copies of the encoder embed the same sentence; the one passed in is kept.
    return Objective(GatheredContrastiveTensionLoss(model, 1 / cfg.temperature, gather),
                     lambda batch: [tokens(model, [a for a, _ in batch])])


def tsdae(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    return Objective(tsdae_loss(model), anchors_and_positives(model))  # (noisy input, original)


def masked_lm(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    # The MLM, MNTP and RetroMAE losses move their own inputs to the device.
    loss = MaskedLMLoss(model, mask_ratio)
    return Objective(loss, lambda batch: [features(model, [a for a, _ in batch])], head=loss.head)


def masked_next_token(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
    return Objective(MaskedNextTokenLoss(model, mask_ratio), lambda batch: [features(model, [a for a, _ in batch])])


def retromae(with_infonce: bool) -> ObjectiveFn:
    def objective(recipe, model, cfg, mask_ratio, decoder_visible, gather) -> Objective:
        loss = RetroMAELoss(model, mask_ratio, decoder_visible, cfg.temperature if with_infonce else None, gather)
        sides = (0, 1) if with_infonce else (0,)
        return Objective(loss, lambda batch: [retromae_features(model, [pair[i] for pair in batch]) for i in sides])
    return objective


OBJECTIVES: dict[str, ObjectiveFn] = {
    "crops": info_nce(False), "dropout": info_nce(False), "simcse": info_nce(True), "tsdae": tsdae,
    "ct": contrastive_tension, "mlm": masked_lm, "retromae": retromae(False), "retromae_infonce": retromae(True),
    "semcse": semcse_triplet, "semcse_infonce": semcse_info_nce, "gpl": info_nce(False), "gpl_margin": margin_mse,
    "inpars": info_nce(False), "mntp": masked_next_token,
}
if set(OBJECTIVES) != set(RECIPES):
    raise RuntimeError(f"objectives and recipe registry disagree: {sorted(set(OBJECTIVES) ^ set(RECIPES))}")


def gathered_outputs(loss: nn.Module, module: nn.Module, keys: tuple[str, ...], gather: Gather,
                     tokens: bool = False) -> None:
    """Several processes: each training forward of `module` (a family's model or a module of it) returns its outputs
    `keys` (per-row tensors; `tokens`: with a token axis, filled to the longest of all processes) gathered by `gather`
    from every process, so that `loss`, a loss of sentence-transformers' that reads them, computes the global batch's
    loss in each process, as the dense losses do with their own `gather` (distributed.py). The library's losses embed
    several columns in one merged forward, whose rows a gather would interleave: under `loss` each column runs alone
    (its column_merging_disabled: the same loss and gradients, it says). One process, or no gather: nothing changes."""
    if world()[1] == 1 or gather is no_gather:
        return
    calls: list[ExitStack] = []  # one for each call of `loss` in progress, closed as it returns or raises

    def enter(*_) -> None:
        calls.append(ExitStack())
        calls[-1].enter_context(column_merging_disabled())

    loss.register_forward_pre_hook(enter)
    loss.register_forward_hook(lambda *_: calls.pop().close(), always_call=True)

    def gathered(module: nn.Module, args, output: dict) -> dict:
        if not (module.training and torch.is_grad_enabled()):  # encoding (the probe, the start codes): its own rows
            return output
        return {**output, **{key: (gather_tokens(output[key], gather) if tokens else gather(output[key]))
                             for key in keys}}

    module.register_forward_hook(gathered)


def multi_vector_info_nce(recipe: Recipe, model: MultiVectorEncoder, settings: MultiVectorSettings,
                          cached_rows: int | None, gather: Gather) -> Objective:
    """The multi_vector family's loss for a recipe whose view is (query, document[, hard negative]) rows: InfoNCE
    over MaxSim scores, every other row's documents the negatives (sentence-transformers' own loss: the first
    column is read as queries, expanded where the model says, the others as documents); with `cached_rows`, its
    GradCache form, which embeds that many rows at a time. Its chance level is the dense one's: a model with one
    vector for every token scores every document alike. Several processes: the token vectors and their scoring masks
    gathered from the last module."""
    columns = 2 if recipe.hard_negatives else 1
    loss = (CachedMaxSimLoss(model, scale=settings.scale, mini_batch_size=cached_rows)
            if cached_rows else MultiVectorMultipleNegativesRankingLoss(model, scale=settings.scale))
    gathered_outputs(loss, model[-1], ("token_embeddings", "attention_mask"), gather, tokens=True)
    return Objective(loss, anchors_and_positives(model, as_queries=True), lambda rows: math.log(columns * rows))


def sparse_info_nce(model: SparseEncoder, settings: SparseSettings, cached_rows: int | None,
                    gather: Gather) -> Objective:
    """The sparse family's loss (sentence-transformers' own): InfoNCE over the codes' dot products, every other row's
    documents the negatives, plus CSR's reconstructions of the dense vector from its top k and top 4k codes and the
    auxiliary one that revives dead codes, or SPLADE's FLOPS regularisers on the queries' and the documents' term
    weights, warmed up (`regularizer_warmup`; with `cached_rows`, SPLADE's GradCache form, which embeds that many rows
    at a time). No chance level: those terms add to the InfoNCE's, so the total has none to sit at (the health checks
    read the probe). Several processes: SPLADE's term weights gathered, and CSR's dense vectors before its
    autoencoder, which then codes the whole batch in every process (its count of each code's last use too)."""
    info_nce = SparseMultipleNegativesRankingLoss(model, scale=settings.resolved_scale)
    if settings.kind == "csr":
        loss = SummedLoss(CSRLoss(model, info_nce, beta=settings.aux_weight))
        gathered_outputs(loss, model[-2], ("sentence_embedding",), gather)
        return Objective(loss, anchors_and_positives(model))
    weights = dict(document_regularizer_weight=settings.document_regularizer,
                   query_regularizer_weight=settings.query_regularizer)
    loss = (CachedSpladeLoss(model, info_nce, **weights, mini_batch_size=cached_rows) if cached_rows else
            SpladeLoss(model, info_nce, **weights))
    gathered_outputs(loss, model[-1], ("sentence_embedding",), gather)
    return Objective(SummedLoss(loss), anchors_and_positives(model),
                     at_step=regularizer_warmup(loss, settings.regularizer_warmup) if settings.regularizer_warmup
                     else None)


def regularizer_warmup(loss: SpladeLoss, share: float) -> Callable[[int, int], None]:
    """Before each step, SPLADE's regulariser weights as sentence-transformers' trainer sets them (its
    SpladeRegularizerWeightSchedulerCallback, driven by the step as a TrainerState): from 0 at the first step to the
    loss's own weights after `share` of the steps, quadratically. A function of the step alone, so a run resumed from
    a checkpoint weighs each step as one uninterrupted run does."""
    from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import (
        SpladeRegularizerWeightSchedulerCallback,
    )
    from transformers import TrainerState

    schedule = SpladeRegularizerWeightSchedulerCallback(loss, warmup_ratio=share)

    def at_step(step: int, steps: int) -> None:
        if schedule.total_steps != steps:  # the first step of this process: the warm-up's length
            schedule.on_train_begin(None, TrainerState(max_steps=steps), None)
        schedule.on_step_begin(None, TrainerState(global_step=step), None)

    return at_step


def build_objective(model: SentenceTransformer | MultiVectorEncoder | SparseEncoder, recipe: str, cfg: TrainConfig,
                    mask_ratio: float | None, decoder_visible: float | None, gather: Gather | None = None,
                    family: FamilySettings | None = None) -> Objective:
    """The recipe's loss around `model`; `mask_ratio` and `decoder_visible` as the method config
    resolves them. Recipes whose loss compares rows of the batch (the registry's `in_batch_negatives`)
    gather them from every process; `gather` replaces that (a test trains without it). `family`: the settings of a
    family other than dense (tasks/encoders/families.py), whose model trains by its own InfoNCE (the config allows
    it for the family's recipes; GradCache for the multi-vector family and SPLADE, in one process)."""
    spec = RECIPES[recipe]
    gather = gather or (gather_rows if spec.in_batch_negatives else no_gather)
    if isinstance(family, MultiVectorSettings):
        return multi_vector_info_nce(spec, model, family, cfg.cached_rows, gather)
    if isinstance(family, SparseSettings):
        return sparse_info_nce(model, family, cfg.cached_rows, gather)
    objective = OBJECTIVES[recipe](spec, model, cfg, mask_ratio, decoder_visible, gather)
    if cfg.cached_rows:  # the config allows it for spec.mini_batches
        return dataclasses.replace(objective, loss=CachedLoss(objective.loss, cfg.cached_rows))
    return objective
