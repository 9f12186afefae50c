"""flows/runs.py: a model's registration reads back as the model, for the evaluate and nightly flows; a stop is
told from a failure."""

import signal

import pytest
from prefect.exceptions import TerminationSignal

from flows.runs import ReportedModel, stop_signal
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




def raised_within(error: BaseException, within: type[Exception] | None) -> BaseException:
    """`error` as raised, or the `within` error that a library raises while handling it (as torch's checkpoint
    writer raises RuntimeError when a signal handler raises inside its file's write)."""
    try:
        try:
            raise error
        except BaseException:
            if within is None:
                raise
            raise within("unexpected pos")  # noqa: B904 (as the library does: error set as its context)
    except BaseException as e:
        return e


@pytest.mark.parametrize("within", [None, RuntimeError], ids=["as-itself", "inside-a-library-error"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt(), TerminationSignal(signal.SIGTERM)], ids=["ctrl-c", "sigterm"])
def test_a_stop_is_found_as_itself_or_inside_the_error_a_library_made_of_it(stop, within):
    assert stop_signal(raised_within(stop, within)) is stop


def test_a_failure_is_no_stop():
    assert stop_signal(raised_within(ValueError("bad row"), RuntimeError)) is None
    assert stop_signal(RuntimeError("unexpected pos")) is None
