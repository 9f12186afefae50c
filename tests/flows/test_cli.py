"""The `embforge` command end to end, in subprocesses: exit codes, kill -9 and resume, JSON report."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests import processes
from tests.helpers import DEMO_DOCS, cli_env, tiny_config

EMBFORGE = [sys.executable, "-m", "flows.cli"]
REPO = Path(__file__).resolve().parents[2]


def embforge(*args, env=None, timeout=600, forked=True):
    """`embforge ARGS` in a process of its own; `forked=False`: started as a user's, from a bare interpreter."""
    run = processes.run if forked else subprocess.run
    return run([*EMBFORGE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def env(tmp_path, prefect_api):
    return cli_env(tmp_path / "prefect", prefect_api)


def test_bad_config_exits_non_zero_naming_the_field(tmp_path, env):
    config = tiny_config(tmp_path, train={"epochs": "many"})
    result = embforge("run", str(config), env=env)
    assert result.returncode == 2
    assert f"{config}: train.epochs: Input should be a valid integer" in " ".join(result.stdout.split())
    assert not (tmp_path / "store").exists()


def test_set_overrides_are_yaml_values_and_a_bad_one_exits_naming_it(tmp_path, env):
    from flows.cli.common import overrides

    assert overrides(["train.epochs=2", "methods.0.train.lr=1.0e-4", "evaluate.sts=null", "name=a=b"]) == {
        "train.epochs": 2, "methods.0.train.lr": 1e-4, "evaluate.sts": None, "name": "a=b"}
    config = tiny_config(tmp_path)
    result = embforge("run", str(config), "--set", "train.epochs", env=env)
    assert result.returncode == 2 and "--set train.epochs: expected FIELD=VALUE" in result.stdout
    result = embforge("run", str(config), "--set", "methods.5.seed=1", env=env)
    assert result.returncode == 2 and "override methods.5.seed: methods: no item 5 (the list has 2)" in result.stdout
    assert not (tmp_path / "store").exists()


def test_missing_input_file_exits_non_zero(tmp_path, env):
    config = tiny_config(tmp_path, data={"path": str(tmp_path / "missing.parquet")})
    result = embforge("run", str(config), env=env)
    assert result.returncode == 2
    assert (f"{config}: data.path: file or folder not found: {tmp_path / 'missing.parquet'}"
            in " ".join(result.stdout.split()))
    assert not (tmp_path / "store").exists()  # refused when the config loads, before Prefect starts


@pytest.mark.slow
def test_train_trains_a_dense_model_and_in_two_processes_a_multi_vector_and_a_sparse_one_unscored(tmp_path, env):
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer, SparseEncoder

    two = {"devices": 2}  # torchrun's gloo processes, the families' outputs gathered (tests/tasks/methods)
    config = tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops"},
                                            {"name": "crops-mv", "recipe": "crops", "family": "multi_vector",
                                             "multi_vector": {"dim": 16}, "train": two},
                                            {"name": "crops-csr", "recipe": "crops", "family": "sparse",
                                             "sparse": {"active_dims": 8}, "train": two}])
    result = embforge("train", str(config), "--set", "data.limit=60", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    said = " ".join(result.stdout.split())
    assert "trained, not scored" in said and "crops-mv" in said and "crops-csr" in said
    assert (result.stdout + result.stderr).count("training in 2 processes (torchrun, gloo)") == 2
    store = ArtifactStore(tmp_path / "store")
    models = {m["label"]: m for m in Catalog(store).query("SELECT label, artifact FROM models")}
    folder = {label: str(store.path(ArtifactRef.parse(models[label]["artifact"])) / "model") for label in models
              if label.startswith("crops")}
    texts = ["heart attack in adults", "asthma in children"]
    assert SentenceTransformer(folder["crops"], device="cpu").encode(texts).shape == (2, 32)
    multi = MultiVectorEncoder(folder["crops-mv"], device="cpu")
    assert [t.shape[1] for t in multi.encode_document(texts)] == [16, 16]
    codes = SparseEncoder(folder["crops-csr"], device="cpu").encode(texts, convert_to_sparse_tensor=False)
    assert codes.shape == (2, 128) and ((codes != 0).sum(1) <= 8).all() and (codes != 0).any()
    assert not list(store.root.glob("artifacts/embed/*"))  # trained, nothing scored


@pytest.mark.slow
def test_kill_9_during_training_then_resume_from_checkpoint(tmp_path, env):
    # Big enough that training takes a while, so the kill lands mid-way.
    # The file says one epoch; both runs ask for two with --set, so the resume only finds the
    # checkpoint if the override reaches the stage keys the same way both times.
    config = tiny_config(tmp_path, data={"limit": 400}, methods=[{"name": "crops", "recipe": "crops"}],
                         model={"random_init": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128}},
                         train={"batch_size": 8, "epochs": 1, "checkpoint_every": 3, "max_length": 128})
    two_epochs = ["--set", "train.epochs=2"]
    store = ArtifactStore(tmp_path / "store")
    proc = processes.Popen([*EMBFORGE, "run", str(config), *two_epochs], cwd=REPO, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list((store.root / "scratch").glob("train/*/checkpoint.pt")):
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.time() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (store.root / "artifacts" / "train").exists()  # killed before training finished

    result = embforge("run", str(config), *two_epochs, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train[crops]: resuming from checkpoint at step" in result.stdout + result.stderr
    resumed = next(line for line in result.stdout.splitlines() if line.startswith("resumed "))
    assert "ingest" in resumed and "pairs[crops]" in resumed  # a label in brackets is not console markup
    catalog = Catalog(store)
    runs = catalog.query("SELECT run_id, status FROM runs ORDER BY started_at")
    assert [r["status"] for r in runs] == ["crashed", "completed"]  # the killed run never finished
    states = {r["stage"]: r["state"] for r in catalog.query(
        "SELECT stage, state FROM run_stages WHERE run_id = ?", [runs[1]["run_id"]])}
    assert states["ingest"] == states["sentences"] == states["pairs"] == states["tokens"] == states["init"] == "Cached"
    assert states["train"] == "Completed"
    [trained] = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [runs[1]["run_id"]])
    assert store.manifest(ArtifactRef("train", trained["key"]))["config"]["train"]["epochs"] == 2

    # The JSON report has one line per model and metric, with the numbers the catalog holds.
    report = embforge("report", "--json", "--store", str(store.root), env=env)
    lines = [json.loads(line) for line in report.stdout.splitlines()]
    rows = [r for r in lines if r["kind"] == "score"]
    assert {"run_id", "model", "method", "dataset", "metric", "value"} <= set(rows[0])
    sql = {(r["label"], r["metric"], r["split"]): r["value"]
           for r in catalog.query("SELECT * FROM run_metrics WHERE run_id = ?", [runs[1]["run_id"]])}
    assert {(r["model"], r["metric"], r["split"]): r["value"] for r in rows} == sql  # a split: one kNN split's score
    assert len(rows) == len(sql)
    # Then the paired differences: those of the run's report artifact, as the catalog's `paired` view holds them.
    paired = [{k: v for k, v in r.items() if k not in ("kind", "run_id")} for r in lines if r["kind"] == "paired"]
    assert {r["metric"] for r in paired} == {"knn_accuracy", "sts_spearman"}
    assert len(lines) == len(rows) + len(paired)
    assert paired == catalog.query("SELECT p.* EXCLUDE (key) FROM paired p JOIN run_stages s ON s.key = p.key "
                                   "WHERE s.run_id = ? AND s.stage = 'report' ORDER BY metric",
                                   [runs[1]["run_id"]])  # kNN, then STS, as the report lists them

    # Filters pick the latest scores of the matching models; the table is Markdown on request.
    filtered = embforge("report", "--method", "crops", "--since", "2000-01-01", "--markdown",
                        "--store", str(store.root), env=env)
    assert filtered.returncode == 0, filtered.stdout + filtered.stderr
    assert "| task | crops |" in filtered.stdout
    crops_knn = sql[("crops", "knn_accuracy", "seed 42")]  # the paper's split
    assert f"| ohsumed-tiny: knn_accuracy | {crops_knn:.3f} |" in filtered.stdout
    assert embforge("report", "--method", "nope", "--store", str(store.root), env=env).returncode == 1


def test_a_bad_sql_query_exits_non_zero_with_duckdb_message(tmp_path, env):
    (tmp_path / "store").mkdir()  # an empty store
    result = embforge("sql", "SELECT nope FROM runs", "--store", str(tmp_path / "store"), env=env)
    assert result.returncode == 2
    assert "error:" in result.stdout and "nope" in result.stdout and "Traceback" not in result.stderr


def test_select_loads_its_config_once_and_takes_the_store_set_on_the_command_line(tmp_path, monkeypatch):
    """`--set store=...` is the store the search writes to (it was read after the store was chosen, and ignored)."""
    from flows.cli import parser
    from flows.cli.running import select_params

    monkeypatch.delenv("EMBFORGE_STORE", raising=False)
    elsewhere = tmp_path / "elsewhere"
    args = parser().parse_args(["select", str(DEMO_DOCS), "--set", f"store={elsewhere}", "--budget", "30"])
    params, cfg, store = select_params(args)
    assert Path(cfg.store) == elsewhere and params.store == store.url and Path(store.root) == elsewhere
    assert cfg.data.path == str(DEMO_DOCS) and cfg.select.budget == 30
    args = parser().parse_args(["select", str(DEMO_DOCS), "--set", f"store={elsewhere}", "--store", str(tmp_path)])
    assert Path(select_params(args)[2].root) == tmp_path  # --store first, as everywhere
