import numpy as np
import pyarrow as pa
from scipy import sparse

from storage.codes import CODES, code_columns, codes_matrix


def test_codes_go_to_arrow_lists_and_back_in_any_row_order():
    codes = sparse.random(7, 50, density=0.1, format="csr", dtype=np.float32, random_state=1)
    keep = sparse.diags(np.array([1, 1, 1, 0, 1, 1, 1], np.float32))  # text 3: no active dimension
    codes = sparse.csr_matrix(keep @ codes)
    codes.eliminate_zeros()
    table = pa.table(code_columns(codes))
    assert table.column_names == list(CODES) and table.num_rows == 7
    assert table[CODES[0]][0].as_py() == codes[0].indices.tolist()
    assert (codes_matrix(table, 50) != codes).nnz == 0
    order = np.array([6, 5, 4, 3, 2, 1, 0])  # stored last text first: each back at its row
    assert (codes_matrix(pa.table(code_columns(codes[order])), 50, rows=order) != codes).nnz == 0
    narrow = codes_matrix(table)  # as wide as its highest active dimension
    assert narrow.shape == (7, codes.indices.max() + 1) and (narrow != codes[:, : narrow.shape[1]]).nnz == 0


def test_no_active_code_anywhere_and_tables_in_chunks():
    """A table of texts with no active code is at least one dimension wide (what a grouping needs; a model whose
    codes collapsed), an empty one none; a table read in several chunks is one matrix."""
    empty = pa.table(code_columns(sparse.csr_matrix((4, 30), dtype=np.float32)))
    assert codes_matrix(empty).shape == (4, 1) and codes_matrix(empty, 30).nnz == 0
    assert codes_matrix(pa.table(code_columns(sparse.csr_matrix((0, 30), dtype=np.float32))), 30).shape == (0, 30)
    codes = sparse.random(6, 40, density=0.2, format="csr", dtype=np.float32, random_state=5)
    chunks = pa.concat_tables([pa.table(code_columns(codes[:2])), pa.table(code_columns(codes[2:]))])
    assert chunks[CODES[0]].num_chunks == 2 and (codes_matrix(chunks, 40) != codes).nnz == 0


def test_a_weight_stored_as_zero_is_not_an_active_code():
    table = pa.table(code_columns(sparse.csr_matrix(np.array([[0.5, 1e-9, 0.0]], np.float32)), np.float16))
    assert codes_matrix(table, 3).nnz == 1
