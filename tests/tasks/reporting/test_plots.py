import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from sklearn.neighbors import KNeighborsClassifier

from tasks.reporting.plots import layerwise_png, learning_curve_png, tsne_coords, tsne_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def clusters(n_per: int = 40, d: int = 16, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Three Gaussian clusters with centres 20 standard deviations apart."""
    rng = np.random.default_rng(seed)
    centres = 20 * np.eye(3, d)
    emb = np.concatenate([c + rng.normal(size=(n_per, d)) for c in centres])
    return emb, [name for name in ("alpha", "beta", "gamma") for _ in range(n_per)]


def assert_png(path, width: int, height: int):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert imread(path).shape[:2] == (height, width)


def test_tsne_separates_far_apart_clusters():
    emb, labels = clusters()
    coords = tsne_coords(emb, seed=0)
    assert coords.shape == (120, 2)
    knn = KNeighborsClassifier(n_neighbors=5).fit(coords[::2], labels[::2])
    assert knn.score(coords[1::2], labels[1::2]) >= 0.9
    np.testing.assert_array_equal(tsne_coords(emb, seed=0), coords)  # seeded


def test_tsne_png(tmp_path):
    emb, labels = clusters()
    path = tsne_png(emb, labels, tmp_path / "sub" / "tsne.png", "three clusters", max_points=90)
    assert path == tmp_path / "sub" / "tsne.png"
    assert_png(path, 900, 540)


def test_tsne_png_lumps_rare_labels_beyond_the_palette(tmp_path):
    rng = np.random.default_rng(0)
    labels = [f"c{i:02d}" for i in range(45) for _ in range(3)]
    assert_png(tsne_png(rng.normal(size=(135, 8)), labels, tmp_path / "many.png", "45 labels",
                                max_points=5000), 900, 540)


def test_layerwise_png(tmp_path):
    frame = pd.DataFrame([dict(model=m, layer=layer, pooling=p, value=0.3 + 0.02 * layer + 0.05 * (p == "cls"))
                          for m in ("base", "crops") for p in ("mean", "cls") for layer in range(7)])
    assert_png(layerwise_png(frame, tmp_path / "layers.png", "kNN per layer"), 720, 540)


def test_learning_curve_png(tmp_path):
    frame = pd.DataFrame([dict(model=m, step=s, value=0.4 + 0.001 * s * (m == "crops"))
                          for m in ("crops", "dropout") for s in (0, 10, 50, 100, 200)])
    assert_png(learning_curve_png(frame, tmp_path / "curve.png", "kNN vs training"), 720, 540)


@pytest.mark.parametrize("draw", [layerwise_png, learning_curve_png])
def test_line_plots_accept_a_str_path(tmp_path, draw):
    frame = pd.DataFrame(dict(model=["m", "m"], layer=[0, 1], step=[0, 1], pooling=["mean"] * 2, value=[0.1, 0.2]))
    assert draw(frame, str(tmp_path / "p.png"), "t").stat().st_size > 0
