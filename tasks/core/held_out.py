"""Which documents a split holds out: a hash of (seed, doc_id), so that adding documents or rerunning moves none.

Small on purpose: the pairs stage reads it, so every module it imports is part of every training view's identity
(the yardstick's report wording and the queries stage are not).
"""

from __future__ import annotations

from storage.base import stable_hash
from tasks.config.queries import HELD_OUT, TRAIN
from tasks.config.splits import HeldOutShare


def split_of(doc_id: str, seed: int, held_out: float) -> str:
    """`held_out` for a share `held_out` of the documents, `train` for the others: a hash of the
    document alone, so that adding documents or rerunning moves none between splits."""
    return HELD_OUT if int(stable_hash(seed, doc_id), 16) % 10_000 < held_out * 10_000 else TRAIN


def held_out_documents(doc_ids: list[str], cfg: HeldOutShare) -> set[str]:
    """The documents the yardstick holds out of training (tasks/yardstick.py)."""
    return {d for d in doc_ids if split_of(d, cfg.seed, cfg.held_out) == HELD_OUT}
