"""`embforge export` and `embforge mteb-results` on a real run: a sentence-transformers folder with
a card made from the store, ONNX and OpenVINO files that sentence-transformers loads, the Hub
upload call, and mteb's own result files read by mteb."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import yaml
from sentence_transformers import SentenceTransformer

from flows.cli import main
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests.helpers import REPO

# sentence-transformers reads ONNX/OpenVINO folders through optimum, which needs transformers 4:
# .ci/setup makes this environment with that stack (docs/export.md).
OPTIMUM_PYTHON = REPO / ".venv-optimum" / "bin" / "python"
SENTENCES = ["A man is playing a guitar.", "Aspirin lowers the risk of a second heart attack in older patients."]


@pytest.fixture(scope="module")
def exported(tracked_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export") / "crops"
    assert main(["export", "crops", "--to", str(folder), "--store", str(tracked_run.store),
                 "--onnx", "--openvino", "--quantize"]) == 0
    return folder


def scores(tracked_run, label):
    return {r["metric"]: r for r in Catalog(ArtifactStore(tracked_run.store)).query(
        "SELECT metric, value, std FROM run_metrics WHERE run_id = ? AND label = ? AND step IS NULL "
        "AND value IS NOT NULL", [tracked_run.run_id, label])}


def test_folder_loads_and_encodes_as_the_trained_model(exported, tracked_run):
    catalog = Catalog(ArtifactStore(tracked_run.store))
    key = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [tracked_run.run_id])[0]
    trained = SentenceTransformer(str(tracked_run.store / "artifacts" / "train" / key["key"] / "model"))
    model = SentenceTransformer(str(exported))
    np.testing.assert_allclose(model.encode(SENTENCES), trained.encode(SENTENCES), atol=1e-6)


def test_card_is_sentence_transformers_with_the_stores_facts(exported, tracked_run):
    card = (exported / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["library_name"] == "sentence-transformers" and "embforge" in header["tags"]
    results = {(r["dataset"]["name"], m["type"]): m["value"] for entry in header["model-index"]
               for r in entry["results"] for m in r["metrics"]}
    own = scores(tracked_run, "crops")
    assert results[("ohsumed tiny", "knn_accuracy")] == pytest.approx(own["knn_accuracy"]["value"])
    assert results[("STSB slice", "cosine_spearman")] == pytest.approx(own["STSB-slice"]["value"])
    # What the template has no place for, in embforge's section: spread, corpus, training.
    spread = own["knn_accuracy_splits"]
    assert f"| knn_accuracy_splits | ohsumed-tiny | {spread['value']:.4f} | ±{spread['std']:.4f} over 3 splits" in card
    docs = Catalog(ArtifactStore(tracked_run.store)).query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'ingest'", [tracked_run.run_id])[0]["key"]
    assert "**Corpus:** ohsumed-tiny, 150 documents" in card and f"`ingest/{docs}`" in card
    assert "**Recipe:** `crops` (pooling: mean)" in card and "1 x CPU" in card
    assert "`lr`: 0.001" in card  # hyper-parameters in ST's Training Details
    # Every exported backend with its measured STS-B score and the change from torch.
    rows = {line.split("|")[1].strip(): line for line in card.splitlines() if line.startswith("| onnx")
            or line.startswith("| openvino") or line.startswith("| torch")}
    assert set(rows) == {"torch", "onnx", "onnx-int8", "openvino", "openvino-int8"}
    change = {name: float(line.split("|")[4]) for name, line in rows.items()}
    assert abs(change["onnx"]) < 1e-3 and abs(change["openvino"]) < 1e-3 and change["torch"] == 0


BACKEND_FILES = [("onnx", "onnx/model.onnx"), ("onnx", "onnx/model_qint8.onnx"),
                 ("openvino", "openvino/openvino_model.xml"), ("openvino", "openvino/openvino_model_qint8.xml")]


@pytest.fixture(scope="module")
def loaded_elsewhere(exported) -> subprocess.CompletedProcess:
    """Every backend file loaded by sentence-transformers with optimum (in .venv-optimum), in one
    process: its imports take most of the time. Prints one JSON line per file: its vectors."""
    assert OPTIMUM_PYTHON.is_file(), "bash .ci/setup makes .venv-optimum, where sentence-transformers has optimum"
    script = ("import json, sys; from sentence_transformers import SentenceTransformer\n"
              "for backend, name in json.loads(sys.argv[2]):\n"
              "    m = SentenceTransformer(sys.argv[1], backend=backend, device='cpu',\n"
              "                            model_kwargs={'file_name': name})\n"
              "    print(json.dumps(m.encode(json.loads(sys.argv[3])).tolist()), flush=True)")
    return subprocess.run([str(OPTIMUM_PYTHON), "-c", script, str(exported), json.dumps(BACKEND_FILES),
                           json.dumps(SENTENCES)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize(("backend", "file_name"), BACKEND_FILES)
def test_sentence_transformers_loads_every_backend_file(exported, loaded_elsewhere, backend, file_name):
    assert (exported / file_name).is_file()
    out = loaded_elsewhere
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Saving the exported" not in out.stderr  # what it says when it exported a model itself: it loaded ours
    lines = out.stdout.splitlines()[-len(BACKEND_FILES):]  # one per file, in BACKEND_FILES' order
    vectors = np.array(json.loads(lines[BACKEND_FILES.index((backend, file_name))]))
    reference = SentenceTransformer(str(exported)).encode(SENTENCES)
    cosines = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    if "qint8" in file_name:
        assert cosines.min() > 0.98
    else:
        np.testing.assert_allclose(vectors, reference, atol=1e-4)


def test_push_to_hub_uploads_the_folder_as_it_is(exported, tracked_run, tmp_path, monkeypatch):
    """The Hub is not reachable here: the test stops at huggingface_hub's calls (docs/export.md)."""
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo, **kw: calls.append(("create", repo, kw)))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder",
                        lambda self, **kw: calls.append(("upload", kw)) or "https://huggingface.co/lab/crops/commit/1")
    folder = tmp_path / "pushed"
    assert main(["export", "crops", "--to", str(folder), "--store", str(tracked_run.store),
                 "--push-to-hub", "lab/crops-ohsumed", "--private"]) == 0
    assert calls == [("create", "lab/crops-ohsumed", {"private": True, "exist_ok": True}),
                     ("upload", {"folder_path": str(folder), "repo_id": "lab/crops-ohsumed",
                                 "commit_message": "embforge export"})]
    assert 'SentenceTransformer("lab/crops-ohsumed")' in (folder / "README.md").read_text()  # the card's usage


def test_a_push_that_fails_is_one_line_and_the_folder_stays(tracked_run, tmp_path, capsys):
    """HF_HUB_OFFLINE=1 here, as on a machine without the Hub: huggingface_hub refuses the call."""
    folder = tmp_path / "pushed"
    assert main(["export", "crops", "--to", str(folder), "--store", str(tracked_run.store),
                 "--push-to-hub", "lab/crops-ohsumed"]) == 1
    out = capsys.readouterr().out
    said = " ".join(out.split())
    assert f"error: {folder} is written, but pushing it to the Hub repo lab/crops-ohsumed failed" in said
    assert "`hf upload lab/crops-ohsumed" in said and "Traceback" not in out
    assert (folder / "README.md").exists()


def test_export_refuses_what_it_cannot_do(exported, tracked_run, tmp_path, capsys):
    store = str(tracked_run.store)
    assert main(["export", "crops", "--to", str(exported), "--store", store]) == 2  # never overwrites
    assert "not an empty folder" in capsys.readouterr().out
    assert main(["export", "no-such-model", "--to", str(tmp_path / "x"), "--store", store]) == 2
    assert "no registered model has that label" in capsys.readouterr().out
    assert main(["export", "crops", "--to", str(tmp_path / "y"), "--store", store, "--quantize"]) == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    inside = tracked_run.store / "artifacts" / "exported"  # the store's folders are the store's to write
    assert main(["export", "crops", "--to", str(inside), "--store", store]) == 2
    assert f"--to {inside}: inside the store {tracked_run.store}" in " ".join(capsys.readouterr().out.split())
    assert not inside.exists()


def test_export_into_the_empty_working_directory_fills_it(tracked_run, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["export", "crops", "--to", ".", "--store", str(tracked_run.store)]) == 0
    assert (here / "README.md").exists() and SentenceTransformer(str(here)).encode(SENTENCES).shape[0] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["here"]  # no partial folder left beside it


def test_mteb_reads_embforge_results_next_to_others(tracked_run, tmp_path):
    import mteb

    assert main(["mteb-results", "--to", str(tmp_path / "results"), "--store", str(tracked_run.store)]) == 0
    results = mteb.ResultCache(tmp_path / "results").load_results(include_remote=False)
    by_model = {(m.model_name, m.model_revision): m for m in results.model_results}
    catalog = Catalog(ArtifactStore(tracked_run.store))
    train = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [tracked_run.run_id])
    crops = by_model[("embforge/crops-mean", train[0]["key"])]  # the revision is the model's artifact key
    [task] = crops.task_results
    assert task.task_name == "STSB-slice"
    assert task.get_score() == pytest.approx(scores(tracked_run, "crops")["STSB-slice"]["value"], abs=1e-6)
    init = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'init'", [tracked_run.run_id])
    assert ("embforge/init-mean", init[0]["key"]) in by_model


def test_a_failed_export_leaves_nothing_behind(tracked_run, tmp_path, monkeypatch):
    from tasks import export

    def broken(folder, variants):
        raise OSError("disk full")

    monkeypatch.setattr(export, "add_backends", broken)
    with pytest.raises(OSError, match="disk full"):
        main(["export", "crops", "--to", str(tmp_path / "crops"), "--store", str(tracked_run.store), "--onnx"])
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a partial one


def test_weights_changed_in_place_are_not_exported(tracked_run, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(tracked_run.store, store)
    catalog = Catalog(ArtifactStore(store))
    [train] = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [tracked_run.run_id])
    weights = store / "artifacts" / "train" / train["key"] / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100:] = bytes(100)  # the same size: only a digest tells
    weights.write_bytes(bytes(data))
    assert main(["export", "crops", "--to", str(tmp_path / "crops"), "--store", str(store)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert (f"train/{train['key']}: model/model.safetensors has other contents than it was published with "
            "(SHA-256 differs); not exported. `embforge verify` sets it aside") in said
    assert not (tmp_path / "crops").exists()
