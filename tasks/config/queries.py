"""Generated queries (`queries`) and their mined hard negatives (`negatives`): GPL's and InPars' training
data (docs/gpl.md)."""

from __future__ import annotations

from pydantic import Field

from tasks.config.base import Section
from tasks.config.splits import HeldOutShare
from tasks.config.summaries import GenerationConfig, Sampling

TRAIN, HELD_OUT = "train", "held_out"  # a document's split: its queries are trained on, or only evaluated
# What the held-out query text set and the in-domain retrieval read of a queries table (the queries stage's, the
# yardstick's): each query, its one relevant document, its split and its status.
QUERY_COLUMNS = ("query_id", "doc_id", "split", "query", "status")
# An instruction the small offline LLM follows as a continuation; a bigger LLM takes any template.
QUERY_PROMPT = "Write a short search query that this passage answers.\nQuery:"


def query_sampling() -> Sampling:
    """GPL's doc2query sampling: 3 queries per passage, top-k 25, top-p 0.95; a query is one line."""
    return Sampling(n=3, temperature=1.0, top_k=25, top_p=0.95, max_tokens=32, stop=["\n"])


class NegativesConfig(Section):
    """Hard negatives: the passages the start model ranks highest for a query, but not its own."""

    k: int = Field(10, ge=1, description="Hard negatives kept per query: the start model's top-k passages "
                   "other than the query's own (GPL mines 50 and samples from them).")
    duplicate_similarity: float = Field(0.95, gt=0, le=1, description="A candidate whose cosine similarity "
                                        "with the query's own passage is at least this is a near-duplicate "
                                        "of it, not a negative, and is skipped.")
    batch_size: int = Field(64, ge=1, description="Texts per forward pass of the start model (and pairs per "
                            "pass of the cross-encoder).")
    max_length: int = Field(256, ge=8, description="Truncate queries and passages to this many tokens.")
    cross_encoder: str | None = Field(None, description="A cross-encoder (Hub name or folder; GPL's: "
                                      "cross-encoder/ms-marco-MiniLM-L-6-v2) that scores each query with its "
                                      "passage and its mined negatives: the teacher whose margins the "
                                      "`gpl_margin` recipe learns. None: no teacher scores.")


class QueriesConfig(GenerationConfig):
    prompt: str = Field(QUERY_PROMPT, min_length=1, description="Appended to \"title + passage\"; the LLM "
                        "continues it with a query.")
    sampling: Sampling = Field(default_factory=query_sampling, description="`n` = queries per passage.")
    held_out: float = Field(0.1, ge=0, lt=1, description="Share of the documents whose queries are never "
                            "trained on: the in-domain retrieval evaluation's queries.")
    seed: int = Field(0, description="Seed of the held-out draw.")


class AskingDocuments(HeldOutShare):
    """The yardstick's held-out documents an LLM writes queries for (its `queries` kind): at most `most` of them, the
    first by a hash of (seed, doc_id)."""

    most: int | None = None


class AskedQueries(QueriesConfig):
    """The queries stage's job for the yardstick (tasks/config/yardsticks.py's `queries`): the config's `queries`
    section (or its defaults) on the held-out documents only, every one of them `held_out`."""

    asking: AskingDocuments
