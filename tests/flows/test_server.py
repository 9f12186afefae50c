"""The Prefect API a CLI run reports to (`flows/api.prefect_api`), against real servers."""

import json
import os
import urllib.error
import urllib.request

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.api import prefect_api


def health(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        return json.load(response)


def test_without_a_configured_server_a_run_gets_one_of_its_own_stopped_after(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with prefect_api() as url, prefect_api() as inner:
            assert inner == url  # one server per run, not one per call
            assert PREFECT_API_URL.value() == url == os.environ["PREFECT_API_URL"]  # task runners' workers too
            assert health(url) is True
            port = int(url.rsplit(":", 1)[1].removesuffix("/api"))
            assert port not in range(8000, 9000)  # the OS chose it, not a draw in Prefect's range
        assert "PREFECT_API_URL" not in os.environ and not PREFECT_API_URL.value()
        with pytest.raises(urllib.error.URLError):
            health(url)


def test_two_runs_at_once_never_share_a_server(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with prefect_api() as first:
            outer = os.environ.pop("PREFECT_API_URL")  # the second starts as another process would: none set
            try:
                with temporary_settings(restore_defaults={PREFECT_API_URL}), prefect_api() as second:
                    assert second != first and health(first) and health(second)
            finally:
                os.environ["PREFECT_API_URL"] = outer
            assert health(first) is True  # the second stopping leaves the first running
    assert "PREFECT_API_URL" not in os.environ  # nothing left for the next test to talk to


def test_a_configured_server_is_used_as_it_is(monkeypatch):
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:1/api"}), prefect_api() as url:
        assert url == "http://127.0.0.1:1/api"
