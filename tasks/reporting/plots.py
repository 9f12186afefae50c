"""Report pictures: a t-SNE map of a corpus, kNN accuracy per layer, kNN accuracy vs training.

Each function draws one PNG and returns its path. Figures are built as bare `Figure` objects and
rendered by the Agg canvas, never through pyplot: no display is needed, and no global pyplot
state is shared between pipeline tasks that may draw in parallel threads. matplotlib is imported
when a picture is drawn (it takes ~0.7 s): a run, worker or command that draws nothing starts without it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tasks.metrics import dense

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGSIZE, DPI = (6.0, 4.5), 120
# The pictures' file names in the evaluate and report artifacts.
PICTURES = {"tsne": "tsne.png", "layerwise": "layerwise.png", "learning_curve": "learning_curve.png"}
TSNE_FIGSIZE = (7.5, 4.5)  # wider: the legend of up to ~25 labels sits right of the map
OTHER = "other"  # the rarest labels share one grey when there are more labels than colours


@cache
def palette() -> tuple:
    """Strong colours first (tab20's dark halves = tab10), then their light partners, then tab20b:
    40 colours, and a corpus with at most 10 labels gets only clearly distinct ones."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"].colors
    return tab20[::2] + tab20[1::2] + matplotlib.colormaps["tab20b"].colors


def figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, dpi=DPI, layout="constrained")


def save(fig: Figure, path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig).print_png(path)
    return path


def tsne_coords(emb: np.ndarray, seed: int = 0) -> np.ndarray:
    """2-D t-SNE coordinates (PCA init, seeded, so a rerun draws the same map)."""
    # sklearn needs perplexity < n; (n − 1) / 3 keeps the 3·perplexity neighbours it uses within n.
    from sklearn.manifold import TSNE

    perplexity = min(30.0, (len(emb) - 1) / 3)
    return TSNE(n_components=2, perplexity=perplexity, init="pca", learning_rate="auto",
                random_state=seed).fit_transform(np.asarray(emb, dtype=np.float32))


def tsne_name(documents: int, max_points: int) -> str:
    """What a t-SNE map of `documents` shows: says so when it is of a sample."""
    if documents <= max_points:
        return "t-SNE"
    return f"t-SNE of {max_points:,} of {documents:,} documents (sampled)"


def tsne_png(emb: np.ndarray, labels: list[str], path: str | Path, title: str, *, max_points: int,
             seed: int = 0) -> Path:
    """A t-SNE map of at most `max_points` documents (a seeded sample: t-SNE's memory and time grow
    with the documents mapped), coloured by label. A sparse model's codes are made dense for the sample alone."""
    labels = np.asarray(labels, dtype=str)
    if len(labels) > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(len(labels), max_points, replace=False))
        emb, labels = emb[keep], labels[keep]
    coords = tsne_coords(dense(emb), seed)
    names, counts = np.unique(labels, return_counts=True)
    every = palette()
    colours = every[: len(names)]
    if len(names) > len(every):
        names = np.sort(names[np.argsort(-counts, kind="stable")[: len(every) - 1]])
        labels = np.where(np.isin(labels, names), labels, OTHER)
        names, colours = [*names, OTHER], every[: len(names)] + ("0.6",)
    fig = figure(TSNE_FIGSIZE)
    ax = fig.add_subplot()
    for name, colour in zip(names, colours):
        here = labels == name
        ax.scatter(coords[here, 0], coords[here, 1], s=3, color=colour, linewidths=0, label=name)
    ax.set(title=title, xlabel="t-SNE 1", ylabel="t-SNE 2", xticks=[], yticks=[])
    fig.legend(loc="outside right center", fontsize=6, markerscale=3, frameon=False)
    return save(fig, path)


POOLING_STYLES = {"mean": "-", "cls": "--", "sep": ":"}


def line_png(lines: dict[tuple[str, str], pd.DataFrame], x: str, xlabel: str, path: str | Path, title: str) -> Path:
    """One line per (model, pooling) of `lines` (→ frame with columns x and value), y = kNN accuracy.
    A model keeps one colour; its poolings differ by line style."""
    from matplotlib.ticker import MaxNLocator

    fig = figure(FIGSIZE)
    ax = fig.add_subplot()
    colours = {model: palette()[i % len(palette())] for i, model in enumerate(dict.fromkeys(m for m, _ in lines))}
    for (model, pooling), frame in lines.items():
        frame = frame.sort_values(x)
        ax.plot(frame[x], frame["value"], POOLING_STYLES.get(pooling, "-"), marker="o", markersize=3,
                color=colours[model], label=f"{model} ({pooling})" if pooling else model)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=title, xlabel=xlabel, ylabel="kNN accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, handlelength=3)  # long enough to tell dashed from dotted
    return save(fig, path)


def sweep_png(frame: pd.DataFrame, field: str, path: str | Path, title: str) -> Path:
    """kNN accuracy (mean ± std over repeated splits) against a swept value (columns sweep, value_swept,
    value, std), a line per sweep; a log axis when the values span 10x or more (learning rates)."""
    fig = figure(FIGSIZE)
    ax = fig.add_subplot()
    for i, (sweep, points) in enumerate(frame.groupby("sweep", sort=False)):
        points = points.sort_values("value_swept")
        ax.errorbar(points["value_swept"], points["value"], yerr=points["std"].fillna(0), marker="o", markersize=3,
                    capsize=3, color=palette()[i % len(palette())], label=sweep)
    values = frame["value_swept"]
    if (values > 0).all() and values.max() >= 10 * values.min():
        ax.set_xscale("log")
    ax.set(title=title, xlabel=field, ylabel="kNN accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def layerwise_png(frame: pd.DataFrame, path: str | Path, title: str) -> Path:
    """kNN accuracy per hidden layer (columns model, layer, pooling, value), a line per model and pooling."""
    lines = dict(tuple(frame.groupby(["model", "pooling"], sort=False)))
    return line_png(lines, "layer", "layer (0 = embedding layer)", path, title)


def learning_curve_png(frame: pd.DataFrame, path: str | Path, title: str) -> Path:
    """kNN accuracy vs training batches (columns model, step, value), a line per model."""
    lines = {(model, ""): group for model, group in frame.groupby("model", sort=False)}
    return line_png(lines, "step", "training batches (0 = before training)", path, title)


def ladder_png(frame: pd.DataFrame, base: float, metric: str, path: str | Path, title: str) -> Path:
    """A search's yardstick score against training steps (columns candidate, steps, score), a line per candidate
    through the rungs it reached, the untrained model as a dashed line; a log axis (rungs are eta apart)."""
    fig = figure(FIGSIZE)
    ax = fig.add_subplot()
    for i, (candidate, points) in enumerate(frame.dropna(subset=["score"]).groupby("candidate", sort=False)):
        points = points.sort_values("steps")
        ax.plot(points["steps"], points["score"], marker="o", markersize=3, color=palette()[i % len(palette())],
                label=candidate)
    ax.axhline(base, color="grey", linestyle="--", label="untrained model")
    ax.set_xscale("log")
    ax.set(title=title, xlabel="training steps (log)", ylabel=metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)
