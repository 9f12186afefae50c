"""The Prefect API a CLI run reports to (`flows/api.prefect_api`), against real servers."""

import json
import os
import socket
import urllib.error
import urllib.request

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.api import prefect_api, served_hosts


def health(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        return json.load(response)


def status_as(url: str, host: str) -> int:
    """The status of GET `url` sent with the Host header a browser would send for a page at `host`."""
    request = urllib.request.Request(url, headers={"Host": host, "Origin": f"http://{host}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_server_answers_only_the_names_it_serves():
    assert served_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "[::1]"]
    assert served_hosts("::1") == ["[::1]", "127.0.0.1", "localhost"]
    assert served_hosts("10.1.2.3", ("Trainer.Lan",)) == ["10.1.2.3", "trainer.lan"]  # no loopback name
    every = served_hosts("0.0.0.0", ("gpu-box",))
    assert {"0.0.0.0", "gpu-box", "localhost", "127.0.0.1", "[::1]"} <= set(every) and "evil.example" not in every


def test_without_a_configured_server_a_run_gets_one_of_its_own_stopped_after(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with prefect_api() as url, prefect_api() as inner:
            assert inner == url  # one server per run, not one per call
            assert PREFECT_API_URL.value() == url == os.environ["PREFECT_API_URL"]  # task runners' workers too
            assert health(url) is True
            port = int(url.rsplit(":", 1)[1].removesuffix("/api"))
            # A page on a name re-pointed at 127.0.0.1 (DNS rebinding) is refused before any route.
            assert status_as(f"{url}/csrf-token?client=x", f"evil.example:{port}") == 400
            assert status_as(f"{url}/admin/settings", f"localhost:{port}") == 200
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


def test_embforge_server_on_a_port_in_use_is_one_line_naming_the_port(capsys):
    from flows.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["server", "--port", str(port)]) == 2
    printed = capsys.readouterr().out
    assert f"error: --host 127.0.0.1 --port {port}: cannot listen there" in " ".join(printed.split()), printed
