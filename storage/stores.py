"""Which store a location names: a folder is an `ArtifactStore`, a URL (`s3://bucket/prefix`, any
fsspec URL) an `ObjectStore` with a local working copy. The one place that chooses between them."""

from __future__ import annotations

import os
from pathlib import Path

from storage.base import DEFAULT_STORE, is_url
from storage.objects import ObjectStore
from storage.store import ArtifactStore


def store_at(location: str | Path) -> ArtifactStore:
    """The store at a folder or URL, as a stage or command is handed it (`store.url`)."""
    return ObjectStore(str(location)) if is_url(location) else ArtifactStore(location)


def open_store(flag: str | None, configured: str | None = None) -> ArtifactStore:
    """The store a command or flow uses: the flag (`--store`, a flow's `store`), else EMBFORGE_STORE,
    else the config's `store`, else ./embforge-store."""
    return store_at(flag or os.environ.get("EMBFORGE_STORE") or configured or DEFAULT_STORE)
