"""Everything embforge writes to disk: the artifact store (storage/store.py), pools of rows kept
across runs (storage/shards.py), run records (storage/runs.py) and the DuckDB catalog over them
(storage/catalog.py). Import from the module you need: a stage that never reads the catalog does
not depend on its code (a stage's identity follows its imports)."""
