"""A sparse model's codes (a scipy CSR matrix, texts x dimensions) as Arrow columns and back: each text's active
dimensions and their weights, a list of each a row. The embed stage stores a sparse model's texts so, and the evaluate
stage the clusters yardstick's vectors of one, so neither is ever a dense (texts x 30,522) copy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from scipy import sparse

CODES = ("indices", "values")  # each text's active dimensions, and their weights


def code_columns(codes: sparse.csr_matrix, dtype: np.dtype | type = np.float32) -> dict[str, pa.Array]:
    """The CODES columns of `codes`' rows, in their order, the weights as `dtype`."""
    if codes.nnz >= 2**31:  # a list column's offsets are int32
        raise ValueError(f"{codes.nnz:,} active codes are too many for one table: write them in chunks")
    offsets = pa.array(codes.indptr.astype(np.int32))
    return {CODES[0]: pa.ListArray.from_arrays(offsets, pa.array(codes.indices.astype(np.int32))),
            CODES[1]: pa.ListArray.from_arrays(offsets, pa.array(codes.data.astype(dtype)))}


def codes_matrix(table: pa.Table, dim: int | None = None, rows: np.ndarray | None = None) -> sparse.csr_matrix:
    """A float32 (texts x dim) CSR matrix from a table's CODES columns (`dim` None: as wide as its highest active
    dimension, at least 1, which is all a grouping of them needs): its row i at `rows[i]` (each text's row number), or
    in the table's order. A weight that rounded to 0 where it was stored (float16) is not an active code."""
    indices, values = (table[c].combine_chunks() for c in CODES)
    lengths = np.diff(indices.offsets.to_numpy())
    columns = indices.flatten().to_numpy()
    rows = np.arange(table.num_rows) if rows is None else rows
    dim = int(columns.max(initial=0)) + 1 if dim is None else dim
    codes = sparse.csr_matrix((values.flatten().to_numpy().astype(np.float32), (np.repeat(rows, lengths), columns)),
                              shape=(table.num_rows, dim))
    codes.eliminate_zeros()
    return codes
