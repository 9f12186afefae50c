"""Evaluation maths: kNN accuracy, STS correlation, retrieval. Plain NumPy/PyTorch; no Prefect.

Scores between queries and every document are computed a block of queries at a time, each block
sized by `block_rows` to a fixed memory budget, so memory grows with the corpus, not with its square. A sparse
model's codes (scipy CSR) go through them as they are: a dense copy of a SPLADE model's would take 122 KB a text.
"""

import numpy as np
from scipy import sparse

BLOCK_BYTES = 64 << 20  # scratch memory of one block of query × document scores
# The fixed block size used before the budget. A matrix product's last bits depend on its shape,
# so keeping these blocks wherever they fit keeps small corpora's scores bit for bit.
MAX_BLOCK_ROWS = 1024


def block_rows(n_columns: int, bytes_per_cell: int, budget: int = BLOCK_BYTES) -> int:
    """Query rows per block so that its (rows × n_columns) scratch arrays, `bytes_per_cell` bytes
    per score in all, fit `budget` bytes: at least 1, at most MAX_BLOCK_ROWS."""
    return max(1, min(MAX_BLOCK_ROWS, budget // max(1, n_columns * bytes_per_cell)))


def unit_rows(x: np.ndarray | sparse.csr_matrix, dtype: type = np.float64) -> np.ndarray | sparse.csr_matrix:
    """A copy of `x` with rows of length 1 (cosine = dot product), in `dtype`. The same guard as torch's
    F.normalize: a zero row stays zero instead of becoming NaN. A sparse model's codes stay sparse (CSR)."""
    if sparse.issparse(x):
        x = sparse.csr_matrix(x, dtype=dtype, copy=True)
        norms = np.maximum(np.sqrt(row_squares(x)), 1e-12)
        x.data /= np.repeat(norms, np.diff(x.indptr))  # each code by its row's norm
        return x
    x = np.array(x, dtype=dtype)  # one copy, divided in place
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


def ranks_of_own(scores: np.ndarray, own: np.ndarray) -> np.ndarray:
    """1-based rank of each row's own score `own` (b,) among its row of `scores` (b × n). Ties count
    against it: a model that gives every text one vector ranks each own document last, not first."""
    return (scores >= own[:, None]).sum(1)  # (b × n) >= (b × 1), its own cell included


def nan_last(scores: np.ndarray) -> np.ndarray:
    """NaN scores (a model that gives NaN vectors) as -inf: tied with every document not found, so ranked last."""
    return np.where(np.isnan(scores), -np.inf, scores)


def row_squares(x: np.ndarray | sparse.csr_matrix) -> np.ndarray:
    """(rows,) each row's sum of squares, of dense rows or of a sparse matrix's (without a dense copy)."""
    return np.asarray(x.multiply(x).sum(1)).ravel() if sparse.issparse(x) else (x**2).sum(1)


def dense(x: np.ndarray | sparse.spmatrix) -> np.ndarray:
    """A product's result as a NumPy array: one of sparse codes is a sparse matrix."""
    return x.toarray() if sparse.issparse(x) else np.asarray(x)
