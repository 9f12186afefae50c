"""The recipe registry: one record per recipe, the only place its facts are kept.

A recipe = the training view it reads (tasks/pairs.py) + a loss over a batch of (anchor, positive)
texts (tasks/methods/objectives.py, one per recipe here) + its paper's defaults. The config's
`recipe` choices and help text, the pairs view, the default pooling, head and masking ratio, and
which recipes compare rows of the batch (whose negatives multi-device training must gather) are
all read from `RECIPES`. This module holds data only and imports nothing of embforge: the config
(tasks/config/training.py) reads it, never the other way round. The papers' settings are in
docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# (anchor, positive), or (anchor, positive, hard negative) for recipes that mine them, and GPL's margin after
# them: texts, or their token ids (tasks/encoders/inputs.py's Tokens)
Pair = tuple[Any, ...]
View = Literal["crops", "same", "noise", "summaries", "queries"]


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str  # the help text of `methods[].recipe`
    view: View  # the pairs artifact it reads
    pooling: Literal["mean", "cls", "sep"] = "mean"  # the paper's sentence vector
    head: Literal["none", "mlp"] = "none"  # projection head used in training only
    mask_ratio: float | None = None  # encoder masking ratio, for recipes that mask
    enhanced_decoder: bool = False  # RetroMAE's decoder (its `decoder_visible` applies)
    # The loss compares sentence vectors across the rows of a batch, so every other row is a
    # negative: with several devices the vectors must be gathered from all processes.
    in_batch_negatives: bool = False
    # A projection head and Matryoshka dimensions apply (the loss is on the sentence vector alone).
    sentence_head: bool = False
    # The loss is a function of the sentence vectors alone, so it can run cached in mini-batches
    # (GradCache, `train.mini_batch_size`): its encoder passes split from the loss over the batch.
    mini_batches: bool = False
    # Each row also carries a passage the start model ranks high for the anchor query (GPL's mined negative).
    hard_negatives: bool = False
    # Keep a generated query only if the start model ranks its passage within this top (InPars, Promptagator).
    round_trip: int | None = None
    # Each row also carries a cross-encoder's margin, score(query, passage) - score(query, negative): GPL's teacher.
    margins: bool = False
    # Trains decoder models only, with their attention made bidirectional (LLM2Vec's MNTP).
    decoder_only: bool = False

    @property
    def whole_word_masking(self) -> bool:
        return self.enhanced_decoder  # RetroMAE masks whole words

    @property
    def needs(self) -> Literal["summaries", "queries"] | None:
        """The config section whose LLM text the recipe's view is made of, if any."""
        return self.view if self.view in ("summaries", "queries") else None

    @property
    def needs_summaries(self) -> bool:
        return self.needs == "summaries"

    @property
    def needs_queries(self) -> bool:
        return self.needs == "queries"


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("crops", "InfoNCE on two distinct crops of a document", "crops",
           in_batch_negatives=True, sentence_head=True, mini_batches=True),
    Recipe("dropout", "one crop twice, so only dropout makes the views differ (the cropping paper's baseline)",
           "same", in_batch_negatives=True, sentence_head=True, mini_batches=True),
    Recipe("simcse", "unsupervised SimCSE (both views in one forward pass, CLS + MLP head)", "same",
           pooling="cls", head="mlp", in_batch_negatives=True, sentence_head=True, mini_batches=True),
    Recipe("tsdae", "denoising auto-encoder: reconstruct a crop from the vector of its word-deleted copy",
           "noise", pooling="cls"),
    Recipe("ct", "Contrastive Tension with in-batch negatives (two copies of the encoder)", "same",
           in_batch_negatives=True),
    Recipe("mlm", "masked-LM continued pre-training", "same", mask_ratio=0.15),
    Recipe("retromae", "RetroMAE: masked auto-encoding with enhanced decoding (whole-word masking)", "same",
           pooling="cls", mask_ratio=0.3, enhanced_decoder=True),
    Recipe("retromae_infonce", "RetroMAE plus InfoNCE between two crops of one document", "crops",
           pooling="cls", mask_ratio=0.3, enhanced_decoder=True, in_batch_negatives=True),
    Recipe("semcse", "triplet loss between two LLM summaries of one document (needs `summaries`)", "summaries",
           pooling="cls", in_batch_negatives=True, mini_batches=True),
    Recipe("semcse_infonce", "the same pairs with cosine InfoNCE (set `train.temperature: 0.07`, the paper's)",
           "summaries", pooling="cls", in_batch_negatives=True, mini_batches=True),
    Recipe("gpl", "InfoNCE between an LLM-written query and its passage, against the other passages and a hard "
           "negative mined with the start model (GPL without a cross-encoder; needs `queries`)", "queries",
           in_batch_negatives=True, sentence_head=True, mini_batches=True, hard_negatives=True),
    Recipe("gpl_margin", "GPL as published: MarginMSE between the dot-product margin of (query, passage, mined "
           "negative) and a cross-encoder's (needs `queries` and `negatives.cross_encoder`)", "queries",
           hard_negatives=True, margins=True),
    Recipe("inpars", "InfoNCE between an LLM-written query and its passage, keeping only queries whose passage the "
           "start model ranks first (InPars / Promptagator's round-trip filter; needs `queries`)", "queries",
           in_batch_negatives=True, sentence_head=True, mini_batches=True, round_trip=1),
    Recipe("mntp", "masked next-token prediction on a decoder made bidirectional: a masked token is predicted "
           "from the position before it (LLM2Vec's step 2; decoder models only)", "same", mask_ratio=0.2,
           decoder_only=True),
]}


@dataclass(frozen=True)
class Chain:
    """A method trained in stages: each stage an ordinary method of one recipe, starting from the model of the
    stage before (`start_from`); the stages before the last are reported too, as `<name>-<recipe>`."""

    name: str
    description: str
    stages: tuple[tuple[str, dict[str, Any]], ...]  # (recipe, its `train` defaults), in order

    @property
    def recipes(self) -> list[str]:
        return [recipe for recipe, _ in self.stages]


CHAINS: dict[str, Chain] = {c.name: c for c in [
    # LLM2Vec (BehnamGhader et al., 2024): bidirectional attention, MNTP, then unsupervised SimCSE with mean
    # pooling; a decoder has no dropout of its own, and SimCSE's views need some: the paper's 0.3.
    Chain("llm2vec", "LLM2Vec: a decoder made bidirectional trains with `mntp`, then from that model with "
          "unsupervised SimCSE (`dropout`'s views at dropout 0.3, mean pooling); decoder models only",
          (("mntp", {}), ("dropout", {"bidirectional": True, "dropout": 0.3}))),
]}
if set(CHAINS) & set(RECIPES):
    raise RuntimeError(f"chains and recipes share names: {sorted(set(CHAINS) & set(RECIPES))}")


def recipes_of(name: str) -> list[str]:
    """The recipes a method of this name trains: a chain's stages', else the recipe itself."""
    return CHAINS[name].recipes if name in CHAINS else [name]


def recipe_help() -> str:
    return "; ".join(f"`{r.name}`: {r.description}" for r in [*RECIPES.values(), *CHAINS.values()]) + "."


def pooling_help() -> str:
    by_pooling: dict[str, list[str]] = {}
    for r in RECIPES.values():
        by_pooling.setdefault(r.pooling, []).append(r.name)
    return "; ".join(f"{p.upper() if p != 'mean' else p} for {', '.join(names)}" for p, names in by_pooling.items())
