"""`embforge` on an S3 store (SeaweedFS on loopback): the same scores as on a local store, the
read commands, and another worker (empty working copy, another PREFECT_HOME) finding it all cached."""

import json
import subprocess

import pytest

from flows.cli import main
from tests import processes
from tests.flows.test_cli import EMBFORGE, REPO, embforge
from tests.helpers import cli_env, tiny_config

pytestmark = pytest.mark.slow  # runs through the CLI on a loopback S3 server, twice: a minute


def command(capsys, *args: str) -> str:
    """Run a read command in this process (a subprocess spends ~10 s importing) and return its output."""
    assert main(list(args)) == 0
    return capsys.readouterr().out


def scores(capsys, store: str) -> dict:
    lines = command(capsys, "report", "--json", "--store", store).splitlines()
    return {(r["model"], r["metric"], r["split"]): r["value"] for r in map(json.loads, lines) if r["kind"] == "score"}


def test_a_run_on_s3_scores_like_a_local_one_and_another_worker_finds_it_cached(s3_store, tmp_path, capsys,
                                                                                prefect_api):
    config = tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops"}], data={"limit": 60})
    # The same config on a local store and (s3_store set AWS_* and EMBFORGE_CACHE) on S3, at once.
    runs = [processes.Popen([*EMBFORGE, "run", str(config), *store], cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            env=cli_env(tmp_path / home, prefect_api))
            for home, store in (("home-local", []), ("home-1", ["--store", s3_store]))]
    for run in runs:
        output = run.communicate(timeout=600)[0]
        assert run.returncode == 0, output
    assert f"artifacts in {s3_store}" in output
    assert scores(capsys, s3_store) == scores(capsys, str(tmp_path / "store")) != {}

    assert "completed" in command(capsys, "runs", "--store", s3_store)
    assert "artifacts/train/" in command(capsys, "artifacts", "--stage", "train", "--store", s3_store)
    assert "verified" in command(capsys, "verify", "--store", s3_store)

    other = cli_env(tmp_path / "home-2", prefect_api, EMBFORGE_CACHE=str(tmp_path / "cache-2"))
    again = embforge("run", str(config), "--store", s3_store, env=other)
    assert again.returncode == 0, again.stdout + again.stderr
    states = command(capsys, "sql", "SELECT DISTINCT state FROM run_stages WHERE run_id = (SELECT run_id FROM runs "
                     "ORDER BY started_at DESC LIMIT 1)", "--store", s3_store)
    assert "Cached" in states and "Completed" not in states
