"""What a split holds out: documents by a hash of (seed, doc_id), so that adding documents or rerunning moves none;
the queries artifact's held-out queries.

Small on purpose: the pairs and sample stages read it, so every module it imports is part of their identities
(the yardstick's report wording, the queries stage and the encoders are not).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from storage.base import ArtifactRef, stable_hash
from storage.store import ArtifactStore
from tasks.config.queries import HELD_OUT, QUERY_COLUMNS, TRAIN
from tasks.config.splits import HeldOutShare


def split_of(doc_id: str, seed: int, held_out: float) -> str:
    """`held_out` for a share `held_out` of the documents, `train` for the others: a hash of the
    document alone, so that adding documents or rerunning moves none between splits."""
    return HELD_OUT if int(stable_hash(seed, doc_id), 16) % 10_000 < held_out * 10_000 else TRAIN


def held_out_documents(doc_ids: list[str], cfg: HeldOutShare) -> set[str]:
    """The documents the yardstick holds out of training (tasks/yardstick.py)."""
    return {d for d in doc_ids if split_of(d, cfg.seed, cfg.held_out) == HELD_OUT}


def held_out_queries(store: ArtifactStore, ref: ArtifactRef) -> pa.Table:
    """The usable held-out queries (never trained on) of a queries artifact, in its order: the in-domain
    retrieval evaluation's queries (query) and their one relevant document (doc_id)."""
    table = store.read_table(ref, "queries", columns=list(QUERY_COLUMNS))
    return table.filter(pc.and_(pc.equal(table["split"], HELD_OUT), pc.equal(table["status"], "ok")))
