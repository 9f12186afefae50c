"""How a model's queries search its documents: the documents' embed artifact read as the model scores them (one
vector a text by cosine, a sparse model's codes, kept sparse, by their dot product, a multi-vector model's token
vectors by MaxSim), for the evaluate stage's retrieval and the latency stage's timed queries alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from storage.base import ArtifactRef
from storage.store import ArtifactStore
from tasks import embed
from tasks.config.evaluation import MaxSimSearch
from tasks.metrics import retrieval
from tasks.metrics.late_interaction import TokenIndex


@dataclass(frozen=True)
class Searcher:
    """How a model's queries find its documents: the documents as it scores them (one vector a text, a sparse model's
    codes kept sparse, or each text's token vectors), by its similarity (retrieval.SIMILARITIES), and how a query
    set's embed artifact is read."""

    docs: retrieval.Texts
    similarity: str
    read: Callable[[ArtifactRef], retrieval.Texts]
    maxsim: MaxSimSearch = field(default_factory=MaxSimSearch)

    def ranks(self, queries: ArtifactRef, own: np.ndarray) -> np.ndarray:
        """Each query's rank of its own document (its row in the documents)."""
        return retrieval.relevant_ranks(self.read(queries), self.docs, own, similarity=self.similarity)

    def texts(self, rows: np.ndarray) -> retrieval.Texts:
        """The documents at `rows` as queries read them: their vectors, or each one's token vectors."""
        docs = self.docs.docs if isinstance(self.docs, TokenIndex) else self.docs
        return [docs[i] for i in rows] if self.similarity == "maxsim" else docs[rows]

    def among(self, rows: np.ndarray) -> retrieval.Texts:
        """The documents at `rows` alone, searched as the whole corpus is (token vectors through an index of their own
        past `maxsim.exact_up_to`)."""
        texts = self.texts(rows)
        return maxsim_documents(texts, self.maxsim) if self.similarity == "maxsim" else texts


def maxsim_documents(tokens: list[np.ndarray], maxsim: MaxSimSearch) -> list[np.ndarray] | TokenIndex:
    """Documents' token vectors as MaxSim searches them: each scored exactly, or past `maxsim.exact_up_to` documents
    through a TokenIndex."""
    return TokenIndex(tokens, maxsim.nearest, maxsim.probes) if len(tokens) > maxsim.exact_up_to else tokens


def searcher(store: ArtifactStore, docs_emb: ArtifactRef, pooling: str, token_mean: bool,
             x: retrieval.Texts | None = None, maxsim: MaxSimSearch | None = None) -> Searcher | None:
    """How the model retrieves: by cosine of its vectors, a sparse model by the dot product of its codes as its embed
    artifacts keep them (sparse: retrieval.postings_index), or a multi-vector model by MaxSim over the token vectors its
    embed artifacts keep (None where they were not kept: its retrieval is not scored), through an index past
    `maxsim.exact_up_to` documents. `x`: the documents' vectors (embed.read_vectors) where the caller has read them
    already (else read here, where they are needed)."""
    made = store.manifest(docs_emb)
    if not token_mean:  # a query set read once, however many scores ask it (a sparse model's active dimensions too)
        return Searcher(embed.read_vectors(store, docs_emb, pooling) if x is None else x,
                        made["extra"].get("similarity", "cosine"),
                        functools.cache(lambda queries: embed.read_vectors(store, queries, pooling)))
    if not made["config"].get("token_vectors"):
        return None
    maxsim = maxsim or MaxSimSearch()
    return Searcher(maxsim_documents(embed.read_token_vectors(store, docs_emb), maxsim), "maxsim",
                    lambda queries: embed.read_token_vectors(store, queries), maxsim)
