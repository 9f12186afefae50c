"""The Prefect UI in headless Chromium (Debian's /usr/bin/chromium driven by Playwright): fill the
`pipeline` deployment's run form with a tiny config, start the run, wait for Completed, check the
metrics artifact is shown, and save a screenshot (test-output/ui-finished-run.png)."""

import re

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.helpers import REPO, tiny_config

pytestmark = pytest.mark.slow  # a real server, flow runs in subprocesses: minutes
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps dialling out, which this closed network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = REPO / "test-output" / "ui-finished-run.png"


def wait_for_state(page, run_name: str, timeout_s: float = 600) -> str:
    """The run page's state badge updates by itself; a reload now and then is a safety net."""
    main = page.get_by_role("main")
    expect(main.get_by_text(run_name, exact=True).first).to_be_visible()
    final = ("Completed", "Failed", "Crashed", "Cancelled")
    for i in range(int(timeout_s * 2)):
        state = next((s for s in final if main.get_by_text(s, exact=True).first.is_visible()), None)
        if state:
            return state
        if i and i % 90 == 0:
            page.reload()
        page.wait_for_timeout(500)
    raise TimeoutError(f"{run_name} did not finish in {timeout_s} s")


def submit(page, deployment: str, attempts: int = 3):
    """Submit the run form; on a 503, submit again, as a user does after the UI's error toast.
    Prefect's SQLite server opens create_flow_run's transaction DEFERRED, so a write by one of its
    services in between fails it at once (SQLITE_BUSY_SNAPSHOT: no busy timeout applies), and the UI,
    unlike Prefect's Python client, does not retry. Any other status is returned as it is."""
    for attempt in range(attempts):
        with page.expect_response(lambda r: r.url.endswith(f"/deployments/{deployment}/create_flow_run")) as created:
            page.get_by_role("button", name="Submit", exact=True).click()
        if created.value.status != 503 or attempt == attempts - 1:
            return created.value
        page.wait_for_timeout(2_000)


def test_pipeline_run_from_the_ui_form(service, tmp_path):
    # One method: the form is what this test is about.
    config = str(tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops"}]))
    deployment = service.deployment("pipeline/pipeline")["id"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)  # 2 cores: the first load of the UI takes seconds
        expect.set_options(timeout=30_000)

        page.goto(f"{service.url}/")
        expect(page.get_by_role("link", name="Deployments", exact=True)).to_be_visible()
        page.goto(f"{service.url}/v2/deployments/deployment/{deployment}")
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Custom run").click()
        field = page.get_by_role("textbox", name=re.compile(r"^Config( \(Optional\))?$"))
        expect(field).to_have_value("configs/demo.yaml")  # the form shows the default
        field.fill(config)
        created = submit(page, deployment)
        assert created.status == 201
        run = created.json()
        assert run["parameters"]["params"]["config"] == config

        page.goto(f"{service.url}/v2/runs/flow-run/{run['id']}")
        assert wait_for_state(page, run["name"]) == "Completed"
        page.get_by_role("tab", name="Artifacts").click()
        expect(page.get_by_role("link", name=re.compile(r"^table embforge-metrics", re.I))).to_be_visible()
        expect(page.get_by_role("link", name=re.compile(r"^markdown embforge-report", re.I))).to_be_visible()
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        browser.close()
    assert service.call("GET", f"/flow_runs/{run['id']}")["state"]["type"] == "COMPLETED"
