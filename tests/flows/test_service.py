"""embforge as a service: `embforge server` (a real Prefect server with its UI, on loopback) serving
the deployments; runs created through the API as the UI creates them, retried with the real
`prefect flow-run retry`, and the nightly re-evaluation triggered twice."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.data import DEMO_DATA
from tests.flows.conftest import embforge_server
from tests.helpers import SECRET, deployment_count, prefect_home, tiny_config

pytestmark = pytest.mark.slow  # a real server, flow runs in subprocesses: minutes
PREFECT = str(Path(sys.executable).with_name("prefect"))
SICK = DEMO_DATA / "sick_test.parquet"


def test_server_binds_loopback_only(service):
    port = int(service.url.rsplit(":", 1)[1])
    outside = [a for a in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
               if not a.startswith("127.")]
    for address in outside:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect((address, port))
    assert service.call("GET", "/health") is True


def test_a_page_on_another_site_cannot_start_runs_and_the_ui_s_own_origin_can_call(service, tmp_path):
    pipeline = service.deployment("pipeline/pipeline")["id"]
    runs = lambda: len(service.call("POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [pipeline]}}}))  # noqa: E731
    before = runs()

    def raw(method: str, path: str, origin: str, headers: dict | None = None, body: dict | None = None):
        request = urllib.request.Request(f"{service.api}{path}", method=method, headers={"Origin": origin, **(
            headers or {})}, data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.headers
        except urllib.error.HTTPError as e:
            return e.code, e.headers

    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    # The browser's preflight for a page's JSON POST: another site gets no permission, the UI's own origin does.
    _, headers = raw("OPTIONS", f"/deployments/{pipeline}/create_flow_run", "http://evil.example", ask)
    assert headers.get("Access-Control-Allow-Origin") is None
    for origin in (service.url, service.url.replace("127.0.0.1", "localhost")):
        _, headers = raw("OPTIONS", f"/deployments/{pipeline}/create_flow_run", origin, ask)
        assert headers.get("Access-Control-Allow-Origin") == origin
    # What a browser sends without asking (a form's plain-text POST), or a page that ignores CORS: no token, refused.
    config = str(tiny_config(tmp_path))
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/json"}):
        status, _ = raw("POST", f"/deployments/{pipeline}/create_flow_run", "http://evil.example", headers,
                        {"parameters": {"params": {"config": config}}})
        assert status == 403
    assert runs() == before and not (tmp_path / "store").exists()


def test_a_page_whose_name_was_re_pointed_here_is_refused_before_any_route(service, tmp_path):
    """DNS rebinding: a page on evil.example, its name then resolved to 127.0.0.1, is same-origin to its browser
    and could read a CSRF token; its requests carry Host evil.example:PORT and get 400 from every route."""
    pipeline = service.deployment("pipeline/pipeline")["id"]
    runs = lambda: len(service.call("POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [pipeline]}}}))  # noqa: E731
    before, port = runs(), service.url.rsplit(":", 1)[1]

    def status(method: str, path: str, host: str, body: dict | None = None) -> int:
        request = urllib.request.Request(f"{service.url}{path}", method=method, data=None if body is None else
                                         json.dumps(body).encode(), headers={"Host": host, "Origin": f"http://{host}",
                                                                             "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    config = {"parameters": {"params": {"config": str(tiny_config(tmp_path))}}}
    for host in (f"evil.example:{port}", f"evil.example:{port}".upper(), "127.0.0.1.evil.example"):
        assert status("GET", "/api/csrf-token?client=x", host) == 400
        assert status("GET", "/api/admin/settings", host) == 400
        assert status("GET", "/", host) == 400  # the UI too
        assert status("POST", "/api/deployments/filter", host, {}) == 400
        assert status("POST", f"/api/deployments/{pipeline}/create_flow_run", host, config) == 400
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}"):
        assert status("GET", "/api/csrf-token?client=x", host) == 200 and status("GET", "/", host) == 200
    assert runs() == before and not (tmp_path / "store").exists()


def test_deployments_have_typed_forms_and_reject_bad_parameters(service, tmp_path):
    schema = service.deployment("pipeline/pipeline")["parameter_openapi_schema"]
    form = schema["definitions"]["RunParams"]["properties"]
    assert form["config"]["default"] == "configs/demo.yaml" and "Experiment YAML" in form["config"]["description"]
    assert {"overrides", "store"} <= set(form)
    assert "methods" in (service.deployment("train/train")["parameter_openapi_schema"]
                         ["definitions"]["TrainParams"]["properties"])
    assert "force" in (service.deployment("evaluate/evaluate")["parameter_openapi_schema"]
                       ["definitions"]["EvaluateParams"]["properties"])
    service.deployment("summarize/summarize")
    select = service.deployment("select/select")["parameter_openapi_schema"]["definitions"]["SelectParams"]
    assert select["properties"]["config"]["default"] == "configs/select.yaml"
    assert {"corpus", "qrels", "budget", "recipes", "out", "overrides"} <= set(select["properties"])
    assert select["properties"]["budget"]["anyOf"][0]["minimum"] == 2  # the form refuses a budget of 1 step
    nightly = service.deployment("evaluate/nightly")
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["0 3 * * *"]
    assert nightly["schedules"][0]["schedule"]["timezone"]

    # The server checks the form against the schema: no run is created.
    with pytest.raises(urllib.error.HTTPError) as rejected:
        service.start("pipeline/pipeline", config="experiment.txt")
    assert rejected.value.code == 409 and "does not match" in rejected.value.read().decode()
    # What only the flow can check fails the run before its first task, with the reason.
    run = service.wait(service.start("pipeline/pipeline", config=str(tmp_path / "missing.yaml")))
    assert run["state"]["type"] == "FAILED" and "config file not found" in run["state"]["message"]
    config = tiny_config(tmp_path)
    run = service.wait(service.start("pipeline/pipeline", config=str(config), overrides={"train.epochs": 0}))
    assert run["state"]["type"] == "FAILED" and "train.epochs" in run["state"]["message"]
    assert service.task_runs(run["id"]) == []


def test_failed_evaluation_retried_continues_from_cached_stages(service, tmp_path):
    broken = tmp_path / "sick.parquet"
    pd.read_parquet(SICK).head(40).drop(columns=["score"]).to_parquet(broken)
    mteb = {"local": [{"name": "SICK-R-40", "type": "sts", "path": str(broken)}], "max_length": 64}
    config = tiny_config(tmp_path, evaluate={"mteb": mteb}, retries={"attempts": 1, "delay_s": 0})
    run_id = service.start("pipeline/pipeline", config=str(config))
    run = service.wait(run_id)
    assert run["state"]["type"] == "FAILED" and "score" in run["state"]["message"]

    pd.read_parquet(SICK).head(40).to_parquet(broken)  # the benchmark file is mended; retry the run
    env = {**os.environ, "PREFECT_API_URL": service.api, "PREFECT_HOME": str(service.home)}
    retry = subprocess.run([PREFECT, "flow-run", "retry", run_id], env=env, capture_output=True, text=True)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    run = service.wait(run_id)
    assert run["state"]["type"] == "COMPLETED" and run["run_count"] == 2

    first, second = {}, {}
    for t in service.task_runs(run_id):
        states = first if t["flow_run_run_count"] == 1 else second
        states.setdefault(t["name"].split("[")[0], []).append(t["state"]["name"])
    # The bad file is bad input: one attempt, no retries.
    assert first["mteb"] == ["Failed"]
    for stage in ("ingest", "sentences", "init", "pairs", "tokens", "train", "text_tokens"):
        assert set(second[stage]) == {"Cached"}, (stage, second[stage])
    assert set(first["train"]) == {"Completed"}
    assert second["mteb"].count("Completed") == 3  # base, crops, dropout on the mended task
    record = Catalog(ArtifactStore(tmp_path / "store")).query(
        "SELECT status FROM runs WHERE run_id = ?", [run_id])
    assert record == [{"status": "completed"}]


def test_embforge_server_stops_within_10_s_of_a_ctrl_c(tmp_path):  # the stop alone on the cores
    with embforge_server(prefect_home(tmp_path / "prefect-home"), timed_stop=True) as svc:
        assert len(svc.call("POST", "/deployments/filter", {})) == deployment_count()


@pytest.mark.alone  # the stop is timed
def test_a_run_cancelled_in_the_ui_is_recorded_cancelled_and_the_rerun_resumes(service, tmp_path):
    # Training of ~15 s, so that the cancellation lands in it.
    config = tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops"}], train={"epochs": 40})
    run_id = service.start("pipeline/pipeline", config=str(config))
    deadline = time.monotonic() + 300
    while not list((tmp_path / "store" / "scratch").glob("train/*/checkpoint.pt")):
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    asked = time.monotonic()
    service.call("POST", f"/flow_runs/{run_id}/set_state", {"state": {"type": "CANCELLING"}, "force": True})
    run = service.wait(run_id)
    # Prefect 3.9 shows the run Crashed: a served run's task runs outside the main thread, so the
    # SIGTERM stops training where it lands, which its task engine takes as a crash (issue 27 leaves
    # this: a step-boundary stop there, and Cancelled). The store's record knows better.
    assert run["state"]["type"] in ("CANCELLED", "CRASHED")
    assert time.monotonic() - asked < 15  # the runner's poll (1 s here), one training step, the checkpoint
    catalog = Catalog(ArtifactStore(tmp_path / "store"))
    assert catalog.query("SELECT status, error FROM runs") == [{"status": "cancelled", "error": "stopped by SIGTERM"}]

    rerun = service.wait(service.start("pipeline/pipeline", config=str(config)))
    assert rerun["state"]["type"] == "COMPLETED"
    assert any("resuming from checkpoint at step" in e["message"] for e in service.logs(rerun["id"]))


def test_nightly_twice_scores_nothing_new_the_second_time(service, tmp_path):
    config = tiny_config(tmp_path, evaluate={"mteb": {"local": [
        {"name": "SICK-R-40", "type": "sts", "path": str(SICK), "limit": 40}], "max_length": 64}})
    trained = service.wait(service.start("train/train", config=str(config)))
    assert trained["state"]["type"] == "COMPLETED"
    store = ArtifactStore(tmp_path / "store")
    assert {r["method"] for r in Catalog(store).query("SELECT method FROM models")} == {"none", "crops", "dropout"}

    def night(**params) -> tuple[dict, list[dict]]:
        run = service.wait(service.start("evaluate/nightly", config=str(config), **params))
        assert run["state"]["type"] == "COMPLETED", run["state"]["message"]
        catalog = Catalog(store)
        counts = catalog.query("SELECT status, count(*) AS n FROM score_changes WHERE run_id = ? GROUP BY ALL",
                               [run["id"]])
        return {r["status"]: r["n"] for r in counts}, catalog.query("SELECT * FROM metrics ORDER BY ALL")

    first, scores = night()
    assert set(first) == {"new"} and first["new"] > 0
    second, again = night()
    assert set(second) == {"unchanged"} and second["unchanged"] == first["new"]
    assert again == scores  # the catalog rows are the same: nothing was scored again

    # A new task is scored for every model; what was scored stays as it is.
    twitter = {"name": "TwitterURL-40", "type": "pair_classification",
               "path": str(DEMO_DATA / "twitter_url_test.parquet"), "limit": 40}
    third, more = night(overrides={"evaluate.mteb.local": [
        {"name": "SICK-R-40", "type": "sts", "path": str(SICK), "limit": 40}, twitter]})
    assert third["new"] == 3 and third["unchanged"] == first["new"]
    assert [r for r in more if r["metric"] != "TwitterURL-40"] == scores

    forced, _ = night(force=True)
    assert set(forced) == {"same"}  # scored again, same value, compared with what was there


def test_artifacts_and_logs_hold_no_secret_or_outside_path(service, tmp_path):
    run = service.wait(service.start("pipeline/pipeline", config=str(tiny_config(tmp_path))))
    assert run["state"]["type"] == "COMPLETED"
    artifacts = service.artifacts(run["id"])
    assert {"table", "markdown", "progress"} <= {a["type"] for a in artifacts}
    assert any(a["type"] == "progress" and a["data"] == 100 and "train" in a["description"] for a in artifacts)
    store = str(ArtifactStore(tmp_path / "store").root)
    texts = [json.dumps(a["data"]) + (a["description"] or "") for a in artifacts]
    texts += [entry["message"] for entry in service.logs(run["id"])]
    assert len(texts) > 20
    for text in texts:
        assert SECRET not in text
        for path in re.findall(r"(?<![\w.:/])/[\w.-]+(?:/[\w.-]+)+", text):
            assert path.startswith(store), f"absolute path outside the store: {path} in {text[:200]}"
