import numpy as np
import pytest
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier

from tasks.metrics.knn import knn_accuracy, knn_accuracy_spread


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
