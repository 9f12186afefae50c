"""What a split holds out: the yardstick's documents, by a hash of (seed, doc_id), so that adding documents or
rerunning moves none; the queries artifact's held-out queries; and kNN's test documents (docs/methods.md §1), which
the kNN metric scores and the training views leave out, so that kNN accuracy is measured on documents the model never
trained on.

Small on purpose: the pairs and sample stages read it, so every module it imports is part of their identities
(the yardstick's report wording, the queries stage and the encoders are not).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sklearn.model_selection import train_test_split

from storage.base import ArtifactRef, stable_hash
from storage.store import ArtifactStore
from tasks.config.base import Section
from tasks.config.queries import HELD_OUT, QUERY_COLUMNS, TRAIN
from tasks.config.splits import HeldOutShare


def split_of(doc_id: str, seed: int, held_out: float) -> str:
    """`held_out` for a share `held_out` of the documents, `train` for the others: a hash of the
    document alone, so that adding documents or rerunning moves none between splits."""
    return HELD_OUT if int(stable_hash(seed, doc_id), 16) % 10_000 < held_out * 10_000 else TRAIN


def held_out_documents(doc_ids: list[str], cfg: HeldOutShare) -> set[str]:
    """The documents the yardstick holds out of training (tasks/yardstick.py), of a corpus of `doc_ids`."""
    share = cfg.share(len(doc_ids))
    return {d for d in doc_ids if split_of(d, cfg.seed, share) == HELD_OUT}


def held_out_queries(store: ArtifactStore, ref: ArtifactRef) -> pa.Table:
    """The usable held-out queries (never trained on) of a queries artifact, in its order: the in-domain
    retrieval evaluation's queries (query) and their one relevant document (doc_id)."""
    table = store.read_table(ref, "queries", columns=list(QUERY_COLUMNS))
    return table.filter(pc.and_(pc.equal(table["split"], HELD_OUT), pc.equal(table["status"], "ok")))


class HeldOut(Section):
    """kNN's test split (docs/methods.md §1), whose documents are left out of training."""

    test_size: float
    seed: int


def split_indices(n: int, test_size: float = 0.1, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """Train and test positions among n labelled documents (the paper's split for seed 42)."""
    return train_test_split(np.arange(n), test_size=test_size, random_state=seed)


def knn_test_documents(docs: pa.Table, held_out: HeldOut) -> set[str]:
    """The doc ids kNN accuracy is measured on: the test positions among the labelled documents."""
    labelled = docs.filter(pc.is_valid(docs["label"]))["doc_id"].to_pylist()
    _, test = split_indices(len(labelled), held_out.test_size, held_out.seed)
    return {labelled[i] for i in test}
