"""The model family registry: what a trained model is made of and how it scores a query against a document.

One record per family, the only place its facts are kept: the config's `methods[].family` choices and help text,
and which recipes train it, are read from `FAMILIES`. Data only, importing nothing of embforge (like
tasks/config/recipes.py). docs/families.md gives the papers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    description: str  # the help text of `methods[].family`
    # The recipes that train it (None: every recipe). A family other than dense scores pairs of texts its own way,
    # so it trains on the recipes whose loss is an InfoNCE over (query, document) rows with in-batch negatives.
    recipes: frozenset[str] | None = None
    per_token: bool = False  # a vector per token, scored by MaxSim (not one vector a text)


# The recipes whose loss is an InfoNCE over (query, document) rows with in-batch negatives: what every family trains.
PAIR_RECIPES = frozenset({"crops", "dropout", "gpl", "inpars", "semcse_infonce"})

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("dense", "one vector per text (pooled token states), scored by cosine"),
    Family("multi_vector", "late interaction, ColBERT's: a projected, normalised vector per token, a query scored "
           "against a document by MaxSim (each query token's best match, summed); saved as sentence-transformers' "
           "MultiVectorEncoder",
           PAIR_RECIPES, per_token=True),
    Family("sparse", "learned sparse codes: CSR's (a sparse autoencoder on the dense vector keeps each text's top "
           "`sparse.active_dims` of `sparse.width` codes) or SPLADE's (`sparse.kind: splade`: a masked-LM head's "
           "weights for the vocabulary's terms), a query scored against a document by their dot product; saved as "
           "sentence-transformers' SparseEncoder",
           PAIR_RECIPES),
]}


def family_help() -> str:
    return "The kind of model trained: " + "; ".join(
        f"`{f.name}`: {f.description}" + (f" (recipes {', '.join(sorted(f.recipes))})" if f.recipes else "")
        for f in FAMILIES.values()) + "."
