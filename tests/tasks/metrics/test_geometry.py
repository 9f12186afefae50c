import numpy as np
import pytest

from tasks.metrics.geometry import (
    alignment,
    geometry_rows,
    mean_random_cosine,
    top_pc_variance,
    uniformity,
)

BASIS = np.eye(3)


def test_alignment_by_hand():
    x = np.array([[3.0, 0.0], [0.0, 2.0]])
    assert alignment(x, 5 * x) == 0.0  # identical after normalisation
    assert alignment(x, -x) == pytest.approx(4.0)  # antipodal unit vectors: ‖2u‖² = 4
    # orthogonal pairs: ‖u − v‖² = 2; mixed with an identical pair the mean is 1
    assert alignment(x, x[::-1]) == pytest.approx(2.0)
    assert alignment(x, np.array([[1.0, 0.0], [1.0, 0.0]])) == pytest.approx(1.0)


def test_alignment_needs_matching_rows():
    with pytest.raises(ValueError):
        alignment(BASIS, BASIS[:2])


def test_uniformity_by_hand():
    # two orthogonal unit vectors: one pair at squared distance 2 → log exp(−4)
    assert uniformity(np.array([[2.0, 0.0], [0.0, 0.5]])) == pytest.approx(-4.0)
    assert uniformity(np.tile([[1.0, 2.0, 3.0]], (5, 1))) == pytest.approx(0.0)
    # the pair (u, −u) at distance² 4 and two pairs at distance² 2: log((e^−8 + 2e^−4) / 3)
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    assert uniformity(x) == pytest.approx(np.log((np.exp(-8) + 2 * np.exp(-4)) / 3))


def test_sampled_uniformity_is_close_to_exact():
    x = np.random.default_rng(0).normal(size=(1000, 8)) + 0.5  # a cone, so not trivially −4
    exact = uniformity(x, max_pairs=10**6)  # 499,500 pairs: exact
    sampled = uniformity(x, max_pairs=50_000, seed=1)
    assert exact > -3.5
    assert sampled == pytest.approx(exact, abs=0.01)
    assert uniformity(x, max_pairs=50_000, seed=1) == sampled  # seeded


def test_mean_cosine_by_hand():
    assert mean_random_cosine(BASIS * [1.0, 4.0, 9.0]) == pytest.approx(0.0)
    assert mean_random_cosine(np.tile([[1.0, 1.0]], (4, 1))) == pytest.approx(1.0)
    # pairs: (e1, e1+e2) cos 1/√2, (e1, e2) 0, (e1+e2, e2) 1/√2 → mean √2/3
    x = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert mean_random_cosine(x) == pytest.approx(np.sqrt(2) / 3)


def test_mean_cosine_equals_brute_force_over_pairs():
    x = np.random.default_rng(3).normal(size=(50, 6)) + 1.0
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = u @ u.T
    assert mean_random_cosine(x) == pytest.approx(cos[~np.eye(50, dtype=bool)].mean())


def test_top_pc_variance_by_hand():
    line = np.outer(np.arange(10.0), [1.0, 2.0, -1.0]) + 7.0  # points on a line, off the origin
    assert top_pc_variance(line, 1) == pytest.approx(1.0)
    d = 20
    isotropic = np.random.default_rng(0).normal(size=(20_000, d))
    assert top_pc_variance(isotropic, 1) == pytest.approx(1 / d, rel=0.15)
    assert top_pc_variance(isotropic, d) == pytest.approx(1.0)
    # variances 4, 1, 1 along the axes (a ±2 / ±1 cross): top-1 share = 4 / 6
    cross = np.array([[2, 0, 0], [-2, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], float)
    assert top_pc_variance(cross, 1) == pytest.approx(8 / 12)
    # wider than it has rows (a SPLADE model's vocabulary): the same shares, from the rows' side
    wide = np.hstack([cross, np.zeros((6, 50_000))])
    assert top_pc_variance(wide, 1) == pytest.approx(8 / 12) and top_pc_variance(wide, 2) == pytest.approx(10 / 12)


def test_a_sparse_models_codes_give_what_their_dense_rows_do():
    """Geometry keeps a sparse model's codes sparse: the same values as from their dense rows, uniformity over all pairs
    and over sampled ones, top-k shares from a truncated SVD (ARPACK) and, where k nears the rank, exactly."""
    from scipy import sparse

    codes = sparse.random(300, 4000, density=0.01, format="csr", random_state=2)
    rows = codes.toarray()
    assert uniformity(codes) == pytest.approx(uniformity(rows), abs=1e-12)
    assert uniformity(codes, max_pairs=1000) == pytest.approx(uniformity(rows, max_pairs=1000), abs=1e-12)
    assert mean_random_cosine(codes) == pytest.approx(mean_random_cosine(rows), abs=1e-12)
    for k in (1, 10):
        assert top_pc_variance(codes, k) == pytest.approx(top_pc_variance(rows, k), rel=1e-9)
    assert top_pc_variance(codes[:6], 5) == pytest.approx(top_pc_variance(rows[:6], 5))  # k near the rank: exactly
    assert top_pc_variance(codes[:12], 10) == pytest.approx(top_pc_variance(rows[:12], 10), rel=1e-9)  # ARPACK's most
    zero = sparse.vstack([codes[:20], sparse.csr_matrix((1, 4000))]).tocsr()  # a text with no active code
    assert top_pc_variance(zero, 3) == pytest.approx(top_pc_variance(zero.toarray(), 3), rel=1e-9)
    assert uniformity(zero) == pytest.approx(uniformity(zero.toarray()), abs=1e-12)
    assert top_pc_variance(sparse.csr_matrix(np.ones((5, 40))), 1) is None  # every row the same
    assert [r["value"] for r in geometry_rows(codes)] == pytest.approx([r["value"] for r in geometry_rows(rows)])


def test_where_arpack_does_not_converge_the_share_is_exact_or_said(monkeypatch):
    """ARPACK held to one iteration does not converge: the share then comes exactly from the smaller scatter matrix
    (the rows' n x n for wide codes, the d x d for narrow ones), and where both are wider than SCATTER_MAX the
    geometry's row says so, with no value."""
    import functools

    from scipy import sparse
    from scipy.sparse.linalg import ArpackNoConvergence, svds

    from tasks.metrics import geometry

    monkeypatch.setattr(geometry, "svds", functools.partial(svds, maxiter=1))
    wide = sparse.random(60, 900, density=0.05, format="csr", random_state=3)  # more dimensions than rows
    narrow = sparse.random(900, 60, density=0.05, format="csr", random_state=4)
    for codes in (wide, narrow):
        assert top_pc_variance(codes, 3) == pytest.approx(top_pc_variance(codes.toarray(), 3), rel=1e-9)
    monkeypatch.setattr(geometry, "SCATTER_MAX", 50)
    for codes in (wide, narrow):  # the exact route above was taken: ARPACK did not converge on either
        with pytest.raises(ArpackNoConvergence):
            top_pc_variance(codes, 3)
    shares = {r["metric"]: r for r in geometry_rows(wide)}
    for k in (1, 10):
        assert shares[f"top{k}_pc_variance"]["value"] is None
        assert shares[f"top{k}_pc_variance"]["note"] == "the truncated SVD (ARPACK) did not converge"
    assert shares["uniformity"]["value"] == pytest.approx(uniformity(wide.toarray()), abs=1e-12)


def test_geometry_rows():
    rng = np.random.default_rng(0)
    docs, a = rng.normal(size=(30, 16)), rng.normal(size=(12, 16))
    rows = geometry_rows(docs, a, a + 0.1)
    assert [r["metric"] for r in rows] == ["alignment", "uniformity", "mean_cosine", "top1_pc_variance",
                                           "top10_pc_variance"]
    assert [r["n"] for r in rows] == [12, 30, 30, 30, 30]
    assert all(r["std"] is None and r["repeats"] == 1 and r["split"] is None for r in rows)
    assert rows[0]["value"] == pytest.approx(alignment(a, a + 0.1))
    assert rows[-1]["value"] == pytest.approx(top_pc_variance(docs, 10))
    assert [r["metric"] for r in geometry_rows(docs)] == ["uniformity", "mean_cosine", "top1_pc_variance",
                                                          "top10_pc_variance"]
    # every document the same vector (a corpus of one text under many ids): said, not an error
    same = geometry_rows(np.ones((5, 16)))
    assert [(r["metric"], r["value"]) for r in same[2:]] == [("top1_pc_variance", None), ("top10_pc_variance", None)]
    assert same[1]["value"] == pytest.approx(1.0) and "same vector" in same[2]["note"]
