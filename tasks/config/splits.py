"""The documents a training view leaves out (kNN's test split, the yardstick's share): all the pairs and train stages
need to know of the evaluation, in a module of their own so that editing the rest of `evaluate` (its fields, their
descriptions) does not change their code identity and train everything again."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tasks.config.base import Section

WORTH = 0.03  # a yardstick gain worth a trained model: select's "base" answer says whether its interval rules one out
# `held_out: auto`: enough held-out documents that a paired interval over their queries confirms a true gain of WORTH
# about four times in five: n = ((1.96 + 0.84) x sd / 0.03)^2 = 502 at the largest per-query spread of the paired
# differences titles have shown (sd 0.24, select's first account on 2,000 news articles; 0.15 on 20 Newsgroups'
# first 2,000 posts: docs/select.md, its power); between AUTO_SHARES of the corpus.
ENOUGH_HELD_OUT = 500
AUTO_SHARES = (0.1, 0.25)


class KnnConfig(Section):
    k: int = Field(10, ge=1, description="Neighbours (Euclidean, uniform weights, brute force).")
    test_size: float = Field(0.1, gt=0, lt=1, description="Held-out share of labelled documents.")
    seed: int = Field(42, description="Seed of the headline train/test split (paper: 42).")
    repeats: int = Field(10, ge=0, description="Extra random splits for a mean ± std next to the "
                         "headline number (0 to skip).")


class HeldOutShare(Section):
    """The yardstick's documents: a share of the corpus drawn by a hash of (seed, doc_id), left out of every training
    view (all a pairs artifact needs to know of the yardstick, so every kind shares the training)."""

    held_out: Annotated[float, Field(gt=0, lt=1)] | Literal["auto"] = Field(
        0.1, description="Share of the documents held out of every training view, drawn by a hash of (seed, doc_id): "
        f"the same documents in every run. `auto`: {ENOUGH_HELD_OUT} documents, enough for a paired interval to "
        f"confirm a gain of {WORTH}, but at least {AUTO_SHARES[0]:.0%} of the corpus and at most {AUTO_SHARES[1]:.0%} "
        "(adding documents may then lower it).")
    seed: int = 0

    def share(self, documents: int) -> float:
        """The share held out of a corpus of `documents`."""
        if self.held_out != "auto":
            return self.held_out
        low, high = AUTO_SHARES
        return min(max(ENOUGH_HELD_OUT / max(documents, 1), low), high)
