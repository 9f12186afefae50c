"""The artifact store on an object store (`s3://bucket/prefix`, or any fsspec URL), with a local working copy.

Same layout as a local store, except that an artifact's data objects sit in a folder of their upload:

    artifacts/<stage>/<key>/manifest.json        names the upload ("upload": "<id>"); written last
    artifacts/<stage>/<key>/<id>/*.parquet|model the data of that upload

An object store has no atomic rename, so a build is written to a local temp folder, its data objects
are uploaded under a new upload id, and the manifest is created last with an exclusive create (the
store's conditional PUT): a manifest still means "complete", a truncated upload (data without
manifest) is never read, and of two writers of one key only one publishes; the other removes its own
upload and uses the winner's. Every other file (runs, pools, logs, checkpoints) is put whole (one PUT).

Reads go through a working copy with the local layout (`root`: $EMBFORGE_CACHE/<hash of the URL>,
default ~/.cache/embforge/...): `check(ref)`, which every stage runs on its inputs, downloads an
artifact into it when it is missing there or differs from the store's manifest. Whether a stage is
cached is decided by the object store alone, so every worker sees what any other published.
Credentials and endpoint come from the environment as for every AWS tool (AWS_ENDPOINT_URL, ...).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

import fsspec
from fsspec.utils import glob_translate

from storage.base import (
    MANIFEST,
    ArtifactRef,
    DamagedArtifactError,
    StoreUnusable,
    differences,
    hash_stream,
    stable_hash,
)
from storage.shards import ShardPool
from storage.store import ArtifactStore


def working_copy(url: str) -> Path:
    """Where this machine keeps its copy of the store at `url` (one folder per URL)."""
    return Path(os.environ.get("EMBFORGE_CACHE") or Path.home() / ".cache" / "embforge") / stable_hash(url)


def unreachable(error: Exception) -> str:
    """Why an object store cannot be used, and what to do."""
    name = type(error).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
    if isinstance(error, PermissionError):
        return f"access denied ({error}): check the credentials and the bucket's policy"
    return f"cannot be reached ({name}: {error}); check AWS_ENDPOINT_URL, the network and the credentials"


class ObjectStore(ArtifactStore):
    """The store at a URL: the object store decides what exists, `root` is the working copy."""

    remote = True

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        # Listings are not cached: other workers publish all the time.
        self.fs, _ = fsspec.url_to_fs(self.url, use_listings_cache=False)
        self.working = ArtifactStore(working_copy(self.url))  # a local store: what `check` fills
        self.root = self.working.root
        self._ready = False
        self._saved: dict[ArtifactRef, dict[str, tuple[int, int]]] = {}  # save_scratch's

    def check_writable(self) -> None:
        """Before a run: the working copy as a folder's, and the store as `check_reachable`'s."""
        self.working.check_writable()
        self.check_reachable()

    def check_reachable(self) -> None:
        """One listing of the store with short timeouts and no retries, so that missing credentials or
        an endpoint that does not answer fail in seconds, in one line (the client's own retries take
        about a minute)."""
        fs = self.fs
        if "s3" in fs.protocol:
            fs, _ = fsspec.url_to_fs(self.url, use_listings_cache=False, skip_instance_cache=True,
                                     config_kwargs={"connect_timeout": 5, "read_timeout": 10,
                                                    "retries": {"max_attempts": 1}})
        try:
            fs.ls(self.url)
        except FileNotFoundError:
            pass  # nothing there yet: the first write creates it
        except Exception as e:  # noqa: BLE001 (whatever the client raises, said in one line)
            raise StoreUnusable(f"store {self.url}: {unreachable(e)}") from None

    def _writable(self) -> None:
        """Create the bucket on the first write (reading a store that is not there creates nothing)."""
        if not self._ready:
            self.fs.makedirs(self.url, exist_ok=True)
            self._ready = True

    def _put(self, location: str, data: bytes) -> None:
        self._writable()
        self.fs.pipe_file(location, data)

    def upload(self, path: Path) -> None:
        self._writable()
        self.fs.put_file(str(path), self.location(*path.relative_to(self.root).parts))

    def glob(self, *parts: str) -> list[str]:
        # One flat listing below the fixed part of the pattern: fsspec's glob lists each folder on its own.
        fixed = parts[:next((i for i, p in enumerate(parts) if "*" in p), len(parts))]
        base, pattern = self.fs._strip_protocol(self.url), re.compile(glob_translate(self.location(*parts)))
        with contextlib.suppress(FileNotFoundError):
            found = self.fs.find(self.location(*fixed))
            return sorted(loc for loc in (self.url + p[len(base):] for p in found) if pattern.match(loc))
        return []

    # -- finished artifacts -------------------------------------------------
    def _key(self, ref: ArtifactRef, *parts: str) -> str:
        return self.location("artifacts", ref.stage, ref.key, *parts)

    def _data(self, ref: ArtifactRef, manifest: dict) -> str:
        """The folder of a manifest's data objects (a store copied from a local one has none: the key's)."""
        return self._key(ref, *([manifest["upload"]] if manifest.get("upload") else []))

    def exists(self, ref: ArtifactRef) -> bool:
        return self.fs.exists(self._key(ref, MANIFEST))

    def manifest(self, ref: ArtifactRef) -> dict:
        return json.loads(self.fs.cat_file(self._key(ref, MANIFEST)))

    def _sizes(self, folder: str) -> dict[str, int]:
        """name → size of every object below `folder`."""
        base = self.fs._strip_protocol(folder)
        with contextlib.suppress(FileNotFoundError):
            return {p[len(base) + 1:]: info["size"] for p, info in self.fs.find(folder, detail=True).items()
                    if len(p) > len(base)}  # SeaweedFS answers an emptied folder with the folder itself
        return {}

    def problems(self, ref: ArtifactRef, digests: bool = False) -> list[str]:
        try:
            manifest = self.manifest(ref)
            expected, data = manifest["files"], self._data(ref, manifest)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return [f"{MANIFEST} cannot be read ({e})"]

        def digest(name: str) -> str:
            with self.fs.open(f"{data}/{name}", "rb") as fh:
                return hash_stream(hashlib.sha256(), fh).hexdigest()

        return differences(expected, self._sizes(data), digest if digests else None)

    def check(self, ref: ArtifactRef) -> None:
        """Raise unless the store has the artifact; bring it into the working copy unless it is there as published."""
        try:
            manifest = self.manifest(ref)
        except FileNotFoundError:
            raise FileNotFoundError(f"artifact {ref.address} is not in the store {self.url}") from None
        except ValueError as e:
            raise DamagedArtifactError(f"{ref.address}: {MANIFEST} cannot be read ({e})") from None
        if self.working.readable_manifest(ref) != manifest or self.working.problems(ref):
            self._download(ref, manifest)

    def _download(self, ref: ArtifactRef, manifest: dict) -> None:
        tmp = self.working._temp(ref, "-download")
        try:
            names = list(manifest.get("files") or [])
            for name in names:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            data = self._data(ref, manifest)
            try:
                self.fs.get([f"{data}/{n}" for n in names], [str(tmp / n) for n in names])
            except FileNotFoundError as e:
                raise DamagedArtifactError(f"{ref.address}: a file is missing ({e}); rerun the flow that made it "
                                           "to rebuild it") from None
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            self._install(ref, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            self.working._tidy_temp()
        if found := self.working.problems(ref):  # the store's objects differ from its manifest
            raise DamagedArtifactError(f"{ref.address}: {'; '.join(found)}; rerun the flow that made it to rebuild it")

    def _install(self, ref: ArtifactRef, tmp: Path) -> None:
        """Rename a complete folder into the working copy, in place of what was there."""
        final = self.path(ref)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            self.working.discard(ref)
        with contextlib.suppress(OSError):  # another process of this machine put it there first
            os.rename(tmp, final)

    def _publish(self, ref: ArtifactRef, tmp: Path, manifest: dict) -> None:
        """Upload the data under a new upload id, then create the manifest unless another writer did."""
        self._writable()
        upload = f"upload-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        manifest = {**manifest, "upload": upload}
        names = list(manifest["files"])
        data = self._data(ref, manifest)
        self.fs.put([str(tmp / n) for n in names], [f"{data}/{n}" for n in names])
        body = json.dumps(manifest, indent=2, default=str)
        try:
            self.fs.pipe_file(self._key(ref, MANIFEST), body.encode(), mode="create")
        except OSError:
            if not self.exists(ref):
                raise
            self._remove(data)  # another writer published this key first: use theirs
            self.check(ref)
            return
        for other in self.fs.ls(self._key(ref), detail=False):  # truncated uploads of killed writers
            if not other.endswith((f"/{upload}", f"/{MANIFEST}")):
                self._remove(self.fs.unstrip_protocol(other))
        (tmp / MANIFEST).write_text(body)
        self._install(ref, tmp)

    def _remove(self, location: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # gone already
            self.fs.rm(location, recursive=True)

    def discard(self, ref: ArtifactRef) -> None:
        """Remove the manifest first (the artifact is gone at once), then its upload's data."""
        manifest = self.readable_manifest(ref)
        self._remove(self._key(ref, MANIFEST))
        if manifest:
            with contextlib.suppress(FileNotFoundError):  # another run removed them first
                self.fs.rm([f"{self._data(ref, manifest)}/{n}" for n in manifest.get("files") or []])
        self.working.discard(ref)

    def set_aside(self, ref: ArtifactRef, why: str) -> str | None:
        """Move every object of the key to damaged/ (copies, then deletes: no rename here), with a note."""
        key = self._key(ref)
        found = self._sizes(key)
        if MANIFEST not in found:  # another run set it aside first
            return None
        aside = self.location("damaged", ref.stage, f"{ref.key}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}")
        for name in found:
            self.fs.copy(f"{key}/{name}", f"{aside}/{name}")
        self.fs.pipe_file(f"{aside}/DAMAGED.txt", f"{why}\n".encode())
        self._remove(f"{key}/{MANIFEST}")
        self._remove(key)
        self.working.discard(ref)
        return aside

    def artifact_files(self, name: str, manifests: dict[str, dict]) -> list[str]:
        refs = {location: ArtifactRef(*location.split("/")[-3:-1]) for location in manifests}
        return sorted(f"{self._data(refs[loc], m)}/{name}" for loc, m in manifests.items()
                      if name in (m.get("files") or []))

    def pool(self, name: str, key: str) -> ShardPool:
        return ShardPool(self.fs, self.location("pools", name, key), self._put)

    # -- work in progress ---------------------------------------------------
    def scratch(self, ref: ArtifactRef) -> Path:
        """The local scratch folder, holding what the store has (checkpoints another worker saved)."""
        folder = self.working.scratch(ref)
        remote = self.location("scratch", ref.stage, ref.key)
        names = list(self._sizes(remote))
        downloads = [(folder / n).with_name(f".{Path(n).name}.{uuid.uuid4().hex[:8]}.download") for n in names]
        for path in downloads:
            path.parent.mkdir(parents=True, exist_ok=True)
        if names:
            self.fs.get([f"{remote}/{n}" for n in names], [str(p) for p in downloads])
        for name, path in zip(names, downloads):
            os.replace(path, folder / name)
        return folder

    def save_scratch(self, ref: ArtifactRef) -> None:
        """Put the scratch folder's new files, oldest first: a worker killed mid-way leaves the newest
        checkpoint it had uploaded, each PUT being whole. A file renamed since (the previous checkpoint)
        is copied inside the store instead of uploaded again."""
        self._writable()
        folder, remote = self.working.scratch(ref), self.location("scratch", ref.stage, ref.key)
        saved = self._saved.setdefault(ref, {})  # name → (size, mtime) of what this process put there
        files = sorted((p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")),
                       key=lambda p: p.stat().st_mtime_ns)
        for path in files:
            name, stat = path.relative_to(folder).as_posix(), path.stat()
            found = (stat.st_size, stat.st_mtime_ns)
            if saved.get(name) == found:
                continue
            if source := next((n for n, s in saved.items() if s == found), None):
                self.fs.copy(f"{remote}/{source}", f"{remote}/{name}")
            else:
                self.fs.put_file(str(path), f"{remote}/{name}")
            saved[name] = found

    def drop_scratch(self, ref: ArtifactRef) -> None:
        self.working.drop_scratch(ref)
        self._remove(self.location("scratch", ref.stage, ref.key))
