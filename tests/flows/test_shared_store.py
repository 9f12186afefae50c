"""Two `embforge run`s started together on one store build each artifact they share once."""

import subprocess
import sys
from collections import Counter

import pytest

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests import processes
from tests.helpers import REPO, cli_env, tiny_config

pytestmark = pytest.mark.slow  # two `embforge run`s in subprocesses at once: a minute


def test_two_runs_sharing_stages_build_each_shared_artifact_once(tmp_path, prefect_api):
    store = ArtifactStore(tmp_path / "store")
    configs = []
    # The shared training (~20 s) outlasts the spread of the two runs' start-ups (imports; both report to
    # the session's Prefect server), so whichever run comes second finds it under the other's lease.
    crops = {"name": "crops", "recipe": "crops", "train": {"epochs": 60}}
    for name, methods in [("one", [crops]), ("two", [crops, {"name": "dropout", "recipe": "dropout"}])]:
        (tmp_path / name).mkdir()  # base and crops are shared
        configs.append(tiny_config(tmp_path / name, name=name, store=str(store.root), evaluate={"sts": None},
                                   methods=methods))
    procs = [processes.Popen([sys.executable, "-m", "flows.cli", "run", str(config)], cwd=REPO,
                             env=cli_env(config.parent / "prefect", prefect_api),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for config in configs]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    catalog = Catalog(store)
    runs = {r["name"]: r["run_id"] for r in catalog.query("SELECT name, run_id, status FROM runs")
            if r["status"] == "completed"}
    assert set(runs) == {"one", "two"}
    stages = catalog.query("SELECT run_id, stage, label, key, state FROM run_stages")
    built = Counter(s["key"] for s in stages if s["state"] == "Completed")
    assert set(built.values()) == {1} and set(built) == {s["key"] for s in stages}  # every key built, once
    shared = {s["key"] for s in stages if s["run_id"] == runs["one"]} & {s["key"] for s in stages
                                                                          if s["run_id"] == runs["two"]}
    assert {s["stage"] for s in stages if s["key"] in shared} >= {"ingest", "sentences", "init", "pairs", "tokens",
                                                                  "train", "text_tokens", "embed", "evaluate"}
    assert not list((store.root / "leases").glob("*/*/*"))  # every lease released with its artifact
    assert "waiting for" in "".join(outputs)  # they did overlap: one waited for the other's lease

    def metrics(run: str) -> list[dict]:
        return catalog.query("SELECT label, metric, value FROM run_metrics WHERE run_id = ? AND label != 'dropout' "
                             "ORDER BY label, metric, value", [runs[run]])

    assert metrics("one") == metrics("two") and len(metrics("one")) > 10
