"""Everything embforge writes to disk: what every store shares (storage/base.py: references,
manifests, digests), the store in a folder (storage/store.py) or at a URL (storage/objects.py),
chosen by storage/stores.py; pools of rows kept across runs (storage/shards.py), leases
(storage/leases.py), run records (storage/runs.py) and the DuckDB catalog over them
(storage/catalog.py). Import from the module you need: a stage that never reads the catalog does
not depend on its code (a stage's identity follows its imports)."""
