import numpy as np
import pytest
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier

from tasks.metrics import block_rows
from tasks.metrics.knn import knn_accuracy, knn_accuracy_spread, knn_predict, squared_norms


@pytest.mark.parametrize("k, n_classes, seed", [(10, 5, 42), (1, 3, 0), (7, 2, 3), (10, 23, 1)])
def test_knn_accuracy_equals_scikit_learn(k, n_classes, seed):
    rng = np.random.default_rng(seed)
    labels = rng.choice([f"c{i:02d}" for i in range(n_classes)], size=400)
    x = rng.normal(size=(400, 16)).astype(np.float32) + (np.char.str_len(labels) * 0)[:, None]
    x[:, 0] += np.unique(labels, return_inverse=True)[1] * 0.3  # some signal, many ties in the vote
    train, test = train_test_split(np.arange(400), test_size=0.1, random_state=seed)
    clf = KNeighborsClassifier(n_neighbors=k, algorithm="brute", metric="euclidean").fit(x[train], labels[train])
    expected = (clf.predict(x[test]) == labels[test]).mean()
    acc, n_test = knn_accuracy(x, labels, k=k, test_size=0.1, seed=seed)
    assert n_test == 40
    assert acc == pytest.approx(expected)


def test_knn_spread_is_mean_and_std_over_seeds():
    rng = np.random.default_rng(0)
    x, labels = rng.normal(size=(200, 8)), rng.choice(["a", "b"], size=200)
    scores = [knn_accuracy(x, labels, 5, 0.1, s)[0] for s in range(4)]
    assert knn_accuracy_spread(x, labels, 5, 0.1, range(4)) == pytest.approx(
        (np.mean(scores), np.std(scores, ddof=1)))


def test_blocks_of_any_size_predict_what_one_block_does():
    rng = np.random.default_rng(5)
    train, test = rng.normal(size=(600, 12)).astype(np.float32), rng.normal(size=(300, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=600)
    one_block = knn_predict(train, y, test, 10, 4, block_bytes=1 << 40)
    assert block_rows(600, 16, 1 << 40) >= 300
    # 1 byte: one test document per block; 17 rows of 600 float64 distances and int64 positions
    for budget in (1, 17 * 600 * 16):
        np.testing.assert_array_equal(knn_predict(train, y, test, 10, 4, block_bytes=budget), one_block)


def test_squared_norms_in_blocks_are_the_same_sums():
    x = np.random.default_rng(0).normal(size=(1000, 384))
    np.testing.assert_array_equal(squared_norms(x, block_bytes=384 * 8 * 7), (x**2).sum(1))


def test_a_block_fits_its_budget():
    assert block_rows(100_000, 16) * 100_000 * 16 <= 64 << 20
    assert block_rows(10**9, 16) == 1  # never empty
    assert block_rows(10, 16) == 1024  # small corpora keep the blocks they always had


def test_a_sparse_models_codes_predict_what_their_dense_rows_do():
    """A sparse model's codes stay sparse through kNN (a SPLADE model's 30,522 weights a document would be 240 KB of
    float64 as dense rows): the same neighbours, in blocks of any size."""
    from scipy import sparse

    codes = sparse.random(500, 3000, density=0.01, format="csr", dtype=np.float32, random_state=1)
    labels = np.random.default_rng(1).integers(0, 4, size=500)
    rows = codes.toarray()
    assert knn_accuracy(codes, labels, 10, 0.1, 0) == knn_accuracy(rows, labels, 10, 0.1, 0)
    for budget in (1, 1 << 40):
        np.testing.assert_array_equal(knn_predict(codes[:400], labels[:400], codes[400:], 5, 4, block_bytes=budget),
                                      knn_predict(rows[:400], labels[:400], rows[400:], 5, 4))
    np.testing.assert_allclose(squared_norms(codes.astype(np.float64)), (rows.astype(np.float64) ** 2).sum(1))
