"""Everything embforge writes to disk: the artifact store and the DuckDB catalog over it."""

from storage.catalog import Catalog
from storage.store import ArtifactRef, ArtifactStore, file_digest, stable_hash

__all__ = ["ArtifactRef", "ArtifactStore", "Catalog", "file_digest", "stable_hash"]
