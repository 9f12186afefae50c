"""tasks/core/held_out.py: the documents the training views leave out for kNN."""

import pyarrow as pa
from sklearn.model_selection import train_test_split

from tasks.core.held_out import HeldOut, knn_test_documents


def test_held_out_pairs_leave_out_exactly_the_knn_test_documents():
    ids = [f"d{i}" for i in range(30)]
    docs = pa.table({"doc_id": ids, "label": [None if i % 5 == 0 else str(i % 3) for i in range(30)]})
    labelled = [d for i, d in enumerate(ids) if i % 5]
    _, test = train_test_split(labelled, test_size=0.2, random_state=7)  # the kNN metric's own split
    assert knn_test_documents(docs, HeldOut(test_size=0.2, seed=7)) == set(test)
