"""The evaluate stage on a tiny encoder: which kNN scores it reports, and when it skips them."""

import logging

import pandas as pd

from storage.store import ArtifactStore
from tasks.config import DataConfig, KnnConfig
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.evaluate import EVALUATE, EvalJob, EvaluateInputs
from tasks.ingest import INGEST
from tasks.stage import NoInputs
from tests.helpers import DEMO_DOCS


def metrics_for_labels(tmp_path, model: str, labels: list[str]) -> set[str]:
    """The metric names evaluate reports for 40 demo documents labelled with `labels`, in turn."""
    path = tmp_path / "docs.parquet"
    docs = pd.read_parquet(DEMO_DOCS).head(40)
    docs.assign(label=[labels[i % len(labels)] for i in range(len(docs))]).to_parquet(path)
    store = ArtifactStore(tmp_path / "store")
    documents = INGEST.run(store, DataConfig(path=str(path)), NoInputs())
    embeddings = EMBED.run(store, EmbedJob(model=model, layers="all", max_length=32, batch_size=16),
                           EmbedInputs(documents=documents))
    job = EvalJob(label="tiny", model=model, dataset="demo", knn=KnnConfig(k=3, repeats=2), sts=None,
                  layerwise=True, tsne=False)
    ref = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=embeddings))
    return set(store.read_table(ref, "metrics")["metric"].to_pylist())


def test_knn_scores_are_reported_for_two_labels(tmp_path, tiny_dir):
    assert {"knn_accuracy", "knn_accuracy_splits", "knn_accuracy_layerwise"} <= metrics_for_labels(
        tmp_path, tiny_dir, ["x", "y"])


def test_a_single_label_skips_knn_with_a_warning(tmp_path, tiny_dir, caplog):
    with caplog.at_level(logging.WARNING):
        metrics = metrics_for_labels(tmp_path, tiny_dir, ["x"])
    assert not {m for m in metrics if m.startswith("knn_")}
    assert "uniformity" in metrics  # the other scores are still there
    assert ("all 40 labelled documents have the label 'x': kNN accuracy would be 1.000 for any model, skipped"
            in caplog.text)
