"""Embedding-space geometry (docs/methods.md §6): alignment, uniformity and two anisotropy measures.

They explain *why* a kNN or STS score moved: contrastive training should pull positives together
(alignment ↓), spread documents over the sphere (uniformity ↓) and undo the "narrow cone" of
pre-trained encoders (mean cosine ↓, variance less concentrated in the top principal components).

- alignment  = mean over positive pairs i of ‖u_i − v_i‖², u, v the L2-normalised rows of the two
  views (Wang & Isola with α = 2, as in SimCSE). 0 = identical, 4 = antipodal.
- uniformity = log mean exp(−2‖u_i − u_j‖²) over distinct pairs i ≠ j of L2-normalised
  documents (t = 2). Between −4 (all pairs orthogonal) and 0 (all identical); lower = more uniform.
- mean cosine = mean cos(x_i, x_j) over all distinct pairs i ≠ j: the expected cosine of a random
  pair, computed exactly (see `mean_random_cosine`). 0 for an isotropic set.
- top-k PC variance = share of the total variance of the mean-centred raw embeddings (the vectors
  kNN measures) carried by the k largest principal components (SemCSE's anisotropy variant).
  k = 1 catches a single dominant "common direction"; k = 10 the few rogue directions that
  post-processing such as all-but-the-top removes. An isotropic set gives ≈ k/d.
Everything is computed in float64. A sparse model's codes (scipy CSR) stay sparse: a SPLADE model's 30,522 weights a
document would be 240 KB of float64 each as dense rows.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, svds

from tasks.metrics import dense, row_squares, unit_rows

UNIFORMITY_PAIRS = 250_000  # exact up to n = 707 documents; sampling error of the log ≈ 1e-3 beyond
PAIR_CHUNK = 16_384  # sampled pairs per block: each gathered block is ~100 MB at d = 768
# The widest scatter matrix made exactly where ARPACK does not converge: min(n, d) square, float64, 512 MiB at this
# width (the sparse product it is made from as much again, for a SPLADE model's near-dense X·Xᵀ)
SCATTER_MAX = 8_192


def alignment(x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared distance between the normalised rows x[i] and y[i] (positive pairs)."""
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"alignment needs two equally long, non-empty sets of rows, got {len(x)} and {len(y)}")
    return float(((unit_rows(x) - unit_rows(y)) ** 2).sum(1).mean())


def uniformity(x: np.ndarray, max_pairs: int = UNIFORMITY_PAIRS, seed: int = 0) -> float:
    """log mean exp(−2‖u_i − u_j‖²) over distinct pairs of normalised rows.

    Exact over all n(n−1)/2 pairs when there are at most `max_pairs`; otherwise over `max_pairs`
    pairs drawn uniformly with replacement from the ordered pairs i ≠ j (seeded), which estimates
    the same mean without an n × n matrix.
    """
    u = unit_rows(x)
    n = u.shape[0]
    if n < 2:
        raise ValueError(f"uniformity needs at least 2 rows, got {n}")
    if n * (n - 1) // 2 <= max_pairs:
        norms = row_squares(u)  # 1, or 0 for a zero row
        sq = np.clip(norms[:, None] + norms[None, :] - 2.0 * dense(u @ u.T), 0.0, None)
        kernel = np.exp(-2.0 * sq[np.triu_indices(n, k=1)])
    else:
        rng = np.random.default_rng(seed)
        i = rng.integers(0, n, size=max_pairs)
        j = (i + rng.integers(1, n, size=max_pairs)) % n  # any row but i, each equally likely
        kernel = np.concatenate([
            np.exp(-2.0 * row_squares(u[i[s : s + PAIR_CHUNK]] - u[j[s : s + PAIR_CHUNK]]))
            for s in range(0, max_pairs, PAIR_CHUNK)])
    return float(np.log(kernel.mean()))


def mean_random_cosine(x: np.ndarray) -> float:
    """Expected cosine of a random distinct pair, exact: mean of u_i·u_j over all i ≠ j.

    Σ_{i≠j} u_i·u_j = ‖Σ_i u_i‖² − Σ_i ‖u_i‖², so the mean over all pairs costs O(n·d) and there
    is nothing to gain from sampling pairs.
    """
    u = unit_rows(x)
    n = u.shape[0]
    if n < 2:
        raise ValueError(f"mean cosine needs at least 2 rows, got {n}")
    total = np.asarray(u.sum(0)).ravel()
    squares = u.multiply(u).sum() if sparse.issparse(u) else (u**2).sum()  # dense: one sum, as it always was
    return float((total @ total - squares) / (n * (n - 1)))


def top_pc_variance(x: np.ndarray, k: int) -> float | None:
    """Share of the variance of the mean-centred rows explained by the top k principal components; None
    when every row is the same (a corpus of one text, texts that all tokenize to [UNK]): no variance to share."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if sparse.issparse(x):
        return sparse_top_pc_variance(x, k)
    centred = np.asarray(x, dtype=np.float64)
    centred = centred - centred.mean(0)
    # The squared singular values of the centred data: the eigenvalues of the smaller of its two scatter matrices
    # (n × n where the vectors are wider than there are rows: a SPLADE model's 30,522 terms, d × d would be 7 GB).
    n, d = centred.shape
    return scatter_share(centred @ centred.T if n < d else centred.T @ centred, k)


def scatter_share(scatter: np.ndarray, k: int) -> float | None:
    """The top k eigenvalues' share of a scatter matrix's trace (the centred rows' X·Xᵀ or Xᵀ·X), None where it is 0."""
    eigenvalues = np.clip(np.linalg.eigvalsh(scatter), 0.0, None)[::-1]
    total = eigenvalues.sum()
    return None if total == 0 else float(eigenvalues[:k].sum() / total)


def sparse_top_pc_variance(x: sparse.csr_matrix, k: int) -> float | None:
    """top_pc_variance of a sparse model's codes without centring them (the centred rows are dense): the total
    variance is their squared norms' sum less n·|mean|², the top k from a truncated SVD (ARPACK, seeded) of the
    centred rows as an operator, x·v − (mean·v). Where ARPACK does not converge (close singular values at the k-th),
    exactly from the smaller scatter matrix if it is at most SCATTER_MAX square; past that ArpackNoConvergence."""
    x = sparse.csr_matrix(x, dtype=np.float64)
    n, d = x.shape
    mean = np.asarray(x.mean(0)).ravel()
    squares = row_squares(x).sum()
    total = squares - n * (mean @ mean)
    if total <= 1e-12 * squares:  # every row the same, up to rounding
        return None
    if k >= min(n, d) - 1:  # the top k are (nearly) all of it: ARPACK needs k < min(n, d); a dense copy is small here
        return top_pc_variance(x.toarray(), k)
    # (n, m) and (d, m) blocks: each column of the product less the mean's share
    centred = LinearOperator((n, d), dtype=np.float64, matmat=lambda v: x @ v - mean @ v,
                             rmatmat=lambda u: x.T @ u - np.outer(mean, u.sum(0)),
                             matvec=lambda v: x @ v.ravel() - mean @ v.ravel(),
                             rmatvec=lambda u: x.T @ u.ravel() - mean * u.sum())
    try:
        singular = svds(centred, k=k, return_singular_vectors=False, random_state=0)
    except ArpackNoConvergence:
        if min(n, d) > SCATTER_MAX:
            raise
        if d <= n:  # (d, d): Xᵀ·X less n·mean·meanᵀ
            return scatter_share(dense(x.T @ x) - n * np.outer(mean, mean), k)
        projected = x @ mean  # (n,): each row's dot with the mean; (n, n): X·Xᵀ less both projections, plus |mean|²
        gram = dense(x @ x.T)
        gram -= projected[:, None]  # in place: one (n, n) array, not one a term
        gram -= projected[None, :]
        gram += mean @ mean
        return scatter_share(gram, k)
    return float((singular**2).sum() / total)


def geometry_rows(docs: np.ndarray, pos_a: np.ndarray | None = None, pos_b: np.ndarray | None = None,
                  pcs: tuple[int, ...] = (1, 10)) -> list[dict]:
    """Evaluation rows for one embedding set; alignment only when positive pairs are given."""
    rows = []
    if pos_a is not None and pos_b is not None:
        rows.append(dict(metric="alignment", value=alignment(pos_a, pos_b), n=len(pos_a)))
    n = docs.shape[0]
    rows.append(dict(metric="uniformity", value=uniformity(docs), n=n))
    rows.append(dict(metric="mean_cosine", value=mean_random_cosine(docs), n=n))
    for k in pcs:
        try:
            share = top_pc_variance(docs, k)
            note = None if share is not None else "every document has the same vector: no variance"
        except ArpackNoConvergence:  # a sparse model's codes, too many for an exact scatter matrix
            share, note = None, "the truncated SVD (ARPACK) did not converge"
        rows.append(dict(metric=f"top{k}_pc_variance", value=share, n=n, note=note))
    return [{**row, "std": None, "repeats": 1, "split": None} for row in rows]
