"""Evaluation maths: kNN accuracy, STS correlation. Plain NumPy/PyTorch; no Prefect.

Scores between queries and every document are computed a block of queries at a time, each block
sized by `block_rows` to a fixed memory budget, so memory grows with the corpus, not with its square.
"""

BLOCK_BYTES = 64 << 20  # scratch memory of one block of query × document scores
# The fixed block size used before the budget. A matrix product's last bits depend on its shape,
# so keeping these blocks wherever they fit keeps small corpora's scores bit for bit.
MAX_BLOCK_ROWS = 1024


def block_rows(n_columns: int, bytes_per_cell: int, budget: int = BLOCK_BYTES) -> int:
    """Query rows per block so that its (rows × n_columns) scratch arrays, `bytes_per_cell` bytes
    per score in all, fit `budget` bytes: at least 1, at most MAX_BLOCK_ROWS."""
    return max(1, min(MAX_BLOCK_ROWS, budget // max(1, n_columns * bytes_per_cell)))
