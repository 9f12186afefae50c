"""Everything embforge writes to disk: the artifact store and the DuckDB catalog over it."""

from storage.catalog import METRICS_SCHEMA, Catalog, metrics_table
from storage.shards import ShardPool
from storage.store import ArtifactRef, ArtifactStore, file_digest, stable_hash

__all__ = ["METRICS_SCHEMA", "ArtifactRef", "ArtifactStore", "Catalog", "ShardPool", "metrics_table", "file_digest",
           "stable_hash"]
