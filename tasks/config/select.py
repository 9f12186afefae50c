"""The `select` section: which recipes `embforge select` tries, at which learning rates, on what budget."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from tasks.config.base import Section
from tasks.config.families import FAMILIES
from tasks.config.family_settings import MultiVectorSettings, SparseSettings
from tasks.config.recipes import CHAINS, RECIPES, recipes_of

# Tried when the config names none: those of them whose view the config can build (an LLM's summaries or queries
# only when it has that section: the registry's `needs_*`).
DEFAULT_CANDIDATES = ("crops", "dropout", "tsdae", "semcse", "gpl", "inpars")
# From a decoder LLM: LLM2Vec (its MNTP stage makes the attention bidirectional, its SimCSE stage sets the dropout a
# decoder lacks) in place of dropout, whose views would barely differ, and TSDAE, whose denoising decoder is BERT's.
DECODER_CANDIDATES = ("llm2vec", "crops", "semcse", "gpl", "inpars")


def _defaults_help() -> str:
    plain = [r for r in DEFAULT_CANDIDATES if RECIPES[r].needs is None]
    extra = [(need, names) for need in ("summaries", "queries")
             if (names := [r for r in DEFAULT_CANDIDATES if RECIPES[r].needs == need])]
    added = [r for r in DECODER_CANDIDATES if r not in DEFAULT_CANDIDATES]
    swapped = [r for r in DEFAULT_CANDIDATES if r not in DECODER_CANDIDATES]
    return ", ".join(plain) + ", with " + " and ".join(
        f"{', '.join(names)} when {'it' if i else 'the config'} has `{need}`" for i, (need, names) in enumerate(extra)
    ) + f"; from a decoder LLM, {', '.join(added)} in place of {' and '.join(swapped)}"


class SelectConfig(Section):
    recipes: list[str] | None = Field(None, min_length=1, description="Candidate recipes (the registry's names), "
                                      "or chained ones (llm2vec: its earlier stages train once to the budget, its last "
                                      f"climbs the rungs). Unset: {_defaults_help()}.")
    lrs: list[float] = Field([2e-5, 1e-4], min_length=1, description="Learning rates each recipe is tried at: "
                             "candidates = recipes x learning rates.")
    families: list[Literal[tuple(FAMILIES)]] = Field(
        ["dense"], min_length=1, description="Model families each recipe is tried as (docs/families.md): candidates = "
        "recipes x learning rates x families, a family other than dense only with the recipes that train it (not a "
        "chained one) and on a yardstick that ranks it (a multi-vector model: your qrels, labels, titles or an LLM's "
        "queries, by MaxSim).")
    multi_vector: MultiVectorSettings = Field(default_factory=MultiVectorSettings,
                                              description="With `multi_vector` among `families`: its candidates' "
                                              "projection and loss (as `methods[].multi_vector`).")
    sparse: SparseSettings = Field(default_factory=SparseSettings, description="With `sparse` among `families`: its "
                                   "candidates' kind (CSR, SPLADE), head and loss (as `methods[].sparse`).")
    budget: int = Field(120, ge=2, description="Training steps of the winner: every candidate is on this "
                        "schedule (`train.max_steps`) and the search stops the others at its rungs.")
    eta: int = Field(3, ge=2, description="Successive halving's factor: 1/eta of a rung's candidates go on, to "
                     "eta times its steps.")
    sample: int | None = Field(5000, ge=2, description="The yardstick ranks among at most this many documents "
                               "besides those its queries need, a sample drawn by a hash of each id (tasks/sample.py): "
                               "every rung embeds them, so a large corpus costs what this many do. None: the whole "
                               "corpus.")
    out: str | None = Field(None, description="Folder the chosen model is exported to (empty or new); relative to "
                            "the folder the command runs in. None: `selected/<the corpus's name>`.")
    static: bool = Field(False, description="Also distil the chosen model (or the untrained one, when that is the "
                         "answer) into a static embedding model (docs/static.md; the `static` section's settings, "
                         "else their defaults), score it on the yardstick and its CPU speed beside its teacher, and "
                         "export it to `<out>-static`.")
    confirm: bool = Field(True, description="On a pooled yardstick (consensus, neighbours, clusters), where each "
                          "model is judged by the others and the trained candidates, moving together, judge the "
                          "untrained model: the pool ranks the candidates, but the winner is set against the untrained "
                          "model on a label-free kind that scores each model by itself (titles, else queries an LLM "
                          "writes for the held-out documents), and exported only if it beats it there. false: the "
                          "pooled kind decides alone (no LLM queries on a text-only corpus).")

    @field_validator("recipes")
    @classmethod
    def _known(cls, recipes: list[str] | None) -> list[str] | None:
        if recipes is None:
            return None
        unknown = sorted(set(recipes) - set(RECIPES) - set(CHAINS))
        if unknown:
            raise ValueError(f"unknown recipes {unknown}; the registry has {sorted(RECIPES)} and the chains "
                             f"{sorted(CHAINS)}")
        if len(set(recipes)) != len(recipes):
            raise ValueError(f"recipes must differ, got {recipes}")
        return recipes

    @field_validator("lrs")
    @classmethod
    def _positive(cls, lrs: list[float]) -> list[float]:
        if any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
            raise ValueError(f"learning rates must be positive and differ, got {lrs}")
        return lrs

    @field_validator("families")
    @classmethod
    def _distinct(cls, families: list[str]) -> list[str]:
        if len(set(families)) != len(families):
            raise ValueError(f"families must differ, got {families}")
        return families

    def candidate_recipes(self, summaries: bool, queries: bool, decoder: bool = False) -> list[str]:
        """The recipes named, else the defaults the config can build views for (`decoder`: training starts from a
        decoder LLM)."""
        if self.recipes is not None:
            return self.recipes
        can = {None: True, "summaries": summaries, "queries": queries}  # whether the config can build each view
        return [name for name in (DECODER_CANDIDATES if decoder else DEFAULT_CANDIDATES)
                if all(can[RECIPES[r].needs] for r in recipes_of(name))]

    def candidates(self, recipes: list[str]) -> list[tuple[str, float, str]]:
        """The search's candidates as (recipe, learning rate, family): each of `recipes` at each learning rate as each
        family that trains it (a chained recipe: dense alone, the family's head starting from the base model)."""
        return [(recipe, lr, family) for family in self.families for recipe in recipes for lr in self.lrs
                if family == "dense" or recipe in (FAMILIES[family].recipes or RECIPES)]


def rung_steps(total: int, candidates: int, eta: int) -> list[int]:
    """The steps each rung trains to, shortest first: as many rungs as halvings leave one candidate
    (ceil(log_eta(candidates))), the first `total / eta ** rungs` steps (at least one), each next eta times as many
    (the rungs of Optuna's pruner). The one candidate left then trains to `total`, beyond the last rung."""
    if total < 1 or candidates < 1 or eta < 2:
        raise ValueError(f"a search needs a budget of at least 1 step, a candidate and eta >= 2, not {total}, "
                         f"{candidates} and {eta}")
    rungs = math.ceil(math.log(candidates, eta) - 1e-9) if candidates > 1 else 0
    first = max(1, total // eta ** rungs)
    steps = [first * eta ** k for k in range(rungs)]
    if steps and steps[-1] >= total:
        raise ValueError(f"a budget of {total} steps is too small for {candidates} candidates at eta {eta}: its "
                         f"rungs ({', '.join(map(str, steps))} steps) must stay below it; at least "
                         f"{eta ** (rungs - 1) + 1} steps")
    return steps
