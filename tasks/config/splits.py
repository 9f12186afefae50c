"""The documents a training view leaves out (kNN's test split, the yardstick's share): all the pairs and train stages
need to know of the evaluation, in a module of their own so that editing the rest of `evaluate` (its fields, their
descriptions) does not change their code identity and train everything again."""

from __future__ import annotations

from pydantic import Field

from tasks.config.base import Section


class KnnConfig(Section):
    k: int = Field(10, ge=1, description="Neighbours (Euclidean, uniform weights, brute force).")
    test_size: float = Field(0.1, gt=0, lt=1, description="Held-out share of labelled documents.")
    seed: int = Field(42, description="Seed of the headline train/test split (paper: 42).")
    repeats: int = Field(10, ge=0, description="Extra random splits for a mean ± std next to the "
                         "headline number (0 to skip).")


class HeldOutShare(Section):
    """The yardstick's documents: a share of the corpus drawn by a hash of (seed, doc_id), left out of every training
    view (all a pairs artifact needs to know of the yardstick, so every kind shares the training)."""

    held_out: float = Field(0.1, gt=0, lt=1, description="Share of the documents held out of every training view, "
                            "drawn by a hash of (seed, doc_id): the same documents in every run.")
    seed: int = 0
