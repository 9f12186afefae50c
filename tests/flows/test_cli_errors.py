"""Bad arguments to `embforge` exit 2 with one line naming what is wrong, never a traceback."""

import errno
import os
import subprocess
import sys
from datetime import datetime

import pytest

from flows.cli import main
from flows.cli.catalog import iso_time
from storage.store import ArtifactStore
from tests import processes
from tests.helpers import REPO, cli_env, free_port, tiny_config


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


# Every command that reads a store, with its other arguments.
READERS = {"runs": [], "sql": ["SELECT 1"], "models": [], "artifacts": [], "report": [], "verify": [],
           "mteb-results": ["--to", "results"], "export": ["crops", "--to", "out"]}


@pytest.mark.parametrize("argv, message", [
    (["report", "--since", "notadate"], "argument --since: 'notadate' is not a date"),
    (["sql", ""], "error: the query is empty"),
    (["sql", "COPY (SELECT 1) TO 'x.csv'"], "error: the catalog is read-only: only SELECT queries run, not COPY"),
    (["sql", "SELECT * FROM read_csv('/etc/passwd')"], 'error: Permission Error: Cannot access file "/etc/passwd"'),
    (["sql", "SELECT * FROM read_csv('.tmp/notes.csv')"], 'error: Permission Error: Cannot access file ".tmp/'),
    (["runs", "--store", "notes.txt"], "notes.txt is a file, not a folder"),
    (["runs", "--store", "notes[draft].txt"], "notes[draft].txt is a file, not a folder"),  # not console markup
    *(([command, "--store", "no-such-store", *more], "no-such-store: check --store, EMBFORGE_STORE or the config's")
      for command, more in READERS.items()),
], ids=["date", "empty-sql", "copy", "outside-store", "duckdb-temp-folder", "store-is-a-file", "bracketed-name",
      *(f"missing-store-{c}" for c in READERS)])
def test_a_bad_argument_exits_2_with_one_line_naming_it(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBFORGE_STORE", str(tmp_path / "store"))
    (tmp_path / "store").mkdir()  # an empty store: what the queries read
    (tmp_path / "notes.txt").write_text("not a store")
    (tmp_path / "notes[draft].txt").write_text("not a store")
    (tmp_path / ".tmp").mkdir()  # DuckDB's default spill folder in the working directory
    (tmp_path / ".tmp" / "notes.csv").write_text("private\n")
    assert exit_code(argv) == 2
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in out.out + out.err
    assert "no-such-store" not in message or errors[0].startswith("error: no store at ")
    assert not list(tmp_path.rglob("x.csv")) and not (tmp_path / "no-such-store").exists()


def test_an_existing_empty_store_is_read_as_empty(tmp_path, capsys):
    (tmp_path / "store").mkdir()
    assert exit_code(["runs", "--store", str(tmp_path / "store")]) == 0
    assert "runs: nothing yet" in capsys.readouterr().out


def test_since_takes_a_date_or_an_iso_timestamp_in_utc():
    assert iso_time("2026-01-01") == datetime(2026, 1, 1)
    assert iso_time("2026-01-01T01:00:00+02:00") == datetime(2025, 12, 31, 23)


def test_runs_skips_a_damaged_record_with_a_warning_naming_it(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    for run_id in ("good-run", "cut-run"):
        store.write_run(run_id, dict(run_id=run_id, name="x", status="completed",
                                     started_at="2026-01-01T00:00:00+00:00", stages=[]))
    cut = store.root / "runs" / "cut-run.json"
    cut.write_text(cut.read_text()[:40])
    # A subprocess: the warning reaches the console through the logging Prefect sets up on import.
    result = processes.run([sys.executable, "-m", "flows.cli", "runs", "--store", str(store.root)], cwd=REPO,
                           env={**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}, capture_output=True,
                           text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "good-run" in result.stdout and "cut-run" not in result.stdout
    assert f"skipped the damaged file {cut}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("case, message", [
    ("missing-text", "bad.csv: column 'text' (data.columns.text) not found; the file has body, label"),
    ("empty-corpus", "bad.csv: 0 rows, no documents to ingest"),
    ("one-document", "bad.csv: 1 document; a run needs at least 2"),
    ("unknown-model", "model 'no-such-org/no-such-model': not a local folder"),
    ("collapse", "error: crops recipe: training collapsed at step"),  # an absurd lr (docs/health.md)
    ("collapse-in-2-processes", "error: crops recipe: training collapsed at step"),  # the same under torchrun
    # 21 steps (3 epochs of 6 batches of 20 and one of 8): too short for the running rules, judged at its end
    ("short-collapse", "error: crops recipe: training collapsed at step 21 (lr 30): the loss has been"),
    # the temperature, not the lr, is what blew it up: the message says so
    ("infinite-gradients", "error: crops recipe: training diverged at step 20 (train.temperature 1e-30, lr 0.001): "
                           "the gradient norm has been inf at each of the last 20 steps: none of them changed the "
                           "model. train.temperature 1e-30 multiplies every similarity by 1e+30: raise it (the usual "
                           "is 0.05)"),
    # before the first stage now (the random init's width is known)
    ("static-pca-dims", "error: static.pca_dims: 64 is more than the 32 dimensions of the run's models"),
    # a config mistake found where the adapter is attached (a random init's layers): one line, never retried
    ("lora-targets", "error: train.lora.target_modules: ['q_proj'] match no linear layer of"),
])
def test_bad_input_inside_a_stage_is_one_line_not_retried_and_the_traceback_is_in_the_log(tmp_path, case, message,
                                                                                          prefect_api):
    data = {"missing-text": "body,label\nhello world,a\n", "empty-corpus": "doc_id,title,text,label\n",
            "one-document": "doc_id,title,text,label,split\n1,A title,One text of some length.,a,train\n"}
    (tmp_path / "bad.csv").write_text(data.get(case, ""))
    change = {"unknown-model": {"model": {"name_or_path": "no-such-org/no-such-model"}},
              "collapse": {"train": {"lr": 30.0, "batch_size": 8, "epochs": 2},
                           "methods": [{"name": "crops", "recipe": "crops"}]},
              "collapse-in-2-processes": {"train": {"lr": 30.0, "batch_size": 8, "epochs": 2, "devices": 2},
                                          "methods": [{"name": "crops", "recipe": "crops"}]},
              "short-collapse": {"train": {"lr": 30.0, "batch_size": 20, "epochs": 3},
                                 "methods": [{"name": "crops", "recipe": "crops"}]},
              "infinite-gradients": {"train": {"temperature": 1e-30, "epochs": 3},
                                     "methods": [{"name": "crops", "recipe": "crops"}]},
              "static-pca-dims": {"static": {"of": ["base"], "pca_dims": 64}},  # the tiny encoder has 32
              "lora-targets": {"train": {"lora": {"target_modules": ["q_proj"]}},
                               "methods": [{"name": "crops", "recipe": "crops"}]},
              }.get(case, {"data": {"path": str(tmp_path / "bad.csv")}})
    config = tiny_config(tmp_path, **change)
    result = processes.run([sys.executable, "-m", "flows.cli", "run", str(config)], cwd=REPO, capture_output=True,
                           env=cli_env(tmp_path / "prefect", prefect_api), text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in " ".join(output.split()), output
    assert "Traceback" not in output and "Retry" not in output
    [log] = (tmp_path / "store" / "logs").glob("run-*.log")
    assert "Traceback" in log.read_text() and f"the full log, with tracebacks: {log}" in " ".join(output.split())


def test_a_store_that_cannot_be_written_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys):
    import pathlib

    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(pathlib.Path, "write_bytes", read_only)
    assert exit_code(["run", str(tiny_config(tmp_path)), "--store", str(tmp_path / "store")]) == 2
    out = capsys.readouterr().out
    said = " ".join(out.split())
    assert f"error: store {tmp_path / 'store'}: Read-only file system: {tmp_path / 'store'}/.probe." in said
    assert "choose a store this user can write" in said and "Traceback" not in out
    assert list((tmp_path / "store").iterdir()) == []  # nothing written, no log


@pytest.mark.parametrize("case, message", [
    ("no-credentials", "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ("unreachable", "cannot be reached (EndpointConnectionError"),
])
def test_an_object_store_without_credentials_or_endpoint_is_one_line(tmp_path, monkeypatch, capsys, case, message):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("EMBFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    if case == "unreachable":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "embforge")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "embforge-secret")
    store = "s3://no-such-bucket/store"
    for argv in (["run", str(tiny_config(tmp_path)), "--store", store], ["runs", "--store", store]):
        assert exit_code(argv) == 2, argv
        out = capsys.readouterr().out
        said = " ".join(out.split())
        assert f"error: store {store}: {message}" in said and "Traceback" not in out, argv


@pytest.fixture
def small_disk(tmp_path):
    """A 7 MiB tmpfs: the tiny run's documents and sentences fit, its first model (init) does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_the_store_and_stage_not_retried_and_nothing_half_published(tmp_path,
                                                                                                   small_disk,
                                                                                                   prefect_api):
    store = small_disk / "store"
    env = cli_env(tmp_path / "prefect", prefect_api)
    result = processes.run([sys.executable, "-m", "flows.cli", "run", str(tiny_config(tmp_path)), "--store",
                            str(store)], cwd=REPO, capture_output=True, env=env, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and (f"error: store {store}: init could not be written: No space left on device; free "
                                 "space on that disk or choose another store (--store); every finished stage is kept")\
        in " ".join(output.split()), output
    assert "Traceback" not in output and "Retry" not in output
    verify = processes.run([sys.executable, "-m", "flows.cli", "verify", "--store", str(store)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and "2 artifact(s) verified" in verify.stdout, verify.stdout + verify.stderr
    assert sorted(p.name for p in (store / "artifacts").iterdir()) == ["ingest", "sentences"]
    assert not (store / ".tmp").exists() or not list((store / ".tmp").iterdir())
