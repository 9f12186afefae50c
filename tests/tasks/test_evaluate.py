"""The evaluate stage on a tiny encoder: which kNN scores it reports, and when it skips them."""

import logging

import pandas as pd
import pytest
from scipy import sparse

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.config.evaluation import KnnConfig
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob, read_embeddings
from tasks.encoders.budget import char_budget
from tasks.evaluate import EVALUATE, EvalJob, EvaluateInputs
from tasks.ingest import INGEST
from tasks.metrics import geometry, knn
from tasks.report import tsne_pictures
from tasks.reporting import plots
from tasks.reporting.tables import notes
from tests.helpers import DEMO_DOCS


def evaluated(tmp_path, model: str, labels: list[str], layers: str = "all", **job) -> tuple[ArtifactStore, ArtifactRef]:
    """The evaluate artifact of 40 demo documents labelled with `labels`, in turn, embedded at `layers`."""
    path = tmp_path / "docs.parquet"
    docs = pd.read_parquet(DEMO_DOCS).head(40)
    docs.assign(label=[labels[i % len(labels)] for i in range(len(docs))]).to_parquet(path)
    store = ArtifactStore(tmp_path / "store")
    documents = INGEST.run(store, DataConfig(path=str(path)), NoInputs())
    embeddings = EMBED.run(store, EmbedJob(model=model, layers=layers, max_length=32, batch_size=16),
                           EmbedInputs(documents=documents))
    job = EvalJob(label="tiny", model=model, dataset="demo", knn=KnnConfig(k=3, repeats=2), sts=None,
                  **{"layerwise": True, "tsne": False, **job})
    return store, EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=embeddings))


def metrics_for_labels(tmp_path, model: str, labels: list[str]) -> set[str]:
    """The metric names evaluate reports for 40 demo documents labelled with `labels`, in turn."""
    store, ref = evaluated(tmp_path, model, labels)
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


def test_tsne_maps_a_sample_of_at_most_tsne_max_documents_and_says_so(tmp_path, tiny_dir, monkeypatch):
    drawn = []
    real = plots.tsne_png
    monkeypatch.setattr(plots, "tsne_coords", lambda emb, seed=0: drawn.append(len(emb)) or emb[:, :2])
    monkeypatch.setattr(plots, "tsne_png", lambda *args, **kw: drawn.append(args[3]) or real(*args, **kw))
    store, ref = evaluated(tmp_path, tiny_dir, ["x", "y"], layerwise=False, tsne=True, tsne_max=10)
    assert drawn == ["t-SNE of 10 of 40 documents (sampled): tiny on demo (mean pooling)", 10]
    assert (store.path(ref) / "tsne.png").is_file()
    [(caption, _)] = tsne_pictures(store, [{"key": ref.key, "label": "tiny"}], ArtifactRef("report", "r"))
    assert caption == "t-SNE of 10 of 40 documents (sampled): tiny"


def test_tsne_of_every_document_is_not_called_a_sample():
    assert plots.tsne_name(40, 40) == "t-SNE"
    assert plots.tsne_name(12_000, 5000) == "t-SNE of 5,000 of 12,000 documents (sampled)"


def test_the_report_says_how_many_texts_were_cut_before_tokenizing(tmp_path, tiny_dir):
    store, ref = evaluated(tmp_path, tiny_dir, ["x", "y"], layerwise=False)  # max length 32
    texts = pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(40)
    over = int((texts.str.len() > char_budget(32)).sum())
    assert 0 < over < 40
    [embedded] = store.artifacts("embed")
    assert store.manifest(embedded)["extra"]["cut"] == store.manifest(ref)["extra"]["cut"] == over
    entries = [{"label": "tiny", "method": "m", "key": ref.key}]
    assert notes(Catalog(store), entries) == [
        f"cut: tiny: {over} text(s) of demo (evaluate) were longer than max_length × 32 characters and were cut "
        "to that before tokenizing"]


def test_a_sparse_models_codes_are_scored_without_a_dense_copy_of_the_corpus(tmp_path, tiny_splade_dir, monkeypatch):
    """A SPLADE model's codes (a weight for each of its vocabulary's 30,522 terms, mostly zero) reach kNN and geometry
    as they are stored, sparse: the scores of their dense rows, and no (documents x vocabulary) dense copy made."""
    folder = tiny_splade_dir
    made, real = [], sparse.csr_matrix.toarray

    def toarray(self, *args, **kwargs):  # each dense copy's shape
        made.append(self.shape)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sparse.csr_matrix, "toarray", toarray)
    store, ref = evaluated(tmp_path, folder, ["x", "y"], layers="last", layerwise=False)
    monkeypatch.undo()
    [embedded] = store.artifacts("embed")
    rows = read_embeddings(store, embedded, "mean")  # the codes with their zeros
    assert rows.shape == (40, 30522) and made and not [shape for shape in made if shape[1] == 30522]
    scores = store.read_table(ref, "metrics").to_pandas().drop_duplicates("metric").set_index("metric")["value"]
    labels = ["x", "y"] * 20
    assert scores["knn_accuracy"] == knn.knn_accuracy(rows, labels, 3)[0]
    expected = {r["metric"]: r["value"] for r in geometry.geometry_rows(rows)}
    assert scores[list(expected)].to_dict() == pytest.approx(expected)
    assert store.manifest(ref)["extra"]["active_dims"]["documents"] == (rows != 0).sum(1).mean() > 0
