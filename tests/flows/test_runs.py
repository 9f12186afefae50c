"""flows/runs.py: a model's registration reads back as the model, for the evaluate and nightly flows."""

import pytest

from flows.runs import ReportedModel
from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.runs import RunRecord
from storage.store import ArtifactStore

MODELS = [
    ReportedModel("crops", "crops", ArtifactRef("train", "k1"), knn_holdout=True, tokenizer="org/base-model"),
    ReportedModel("dropout", "dropout", ArtifactRef("train", "k2"), pooling="cls", tokenizer="package:base-model"),
    ReportedModel("org/reference", "reference", None, "org/reference"),  # its own tokenizer
]


@pytest.mark.parametrize("model", MODELS, ids=[m.label for m in MODELS])
def test_a_registered_model_reads_back_with_its_tokenizer_and_knn_holdout(tmp_path, model):
    store = ArtifactStore(tmp_path)
    record = RunRecord(store, "run-1", name="x", flow="pipeline", config_path="c.yaml", overrides={}, config={})
    record.register([model.registration()])
    record.finish("completed")
    [row] = Catalog(store).query("SELECT * FROM models")
    assert ReportedModel.registered(model.label, row) == model
