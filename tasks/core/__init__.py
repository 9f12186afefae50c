"""Stage machinery shared by every stage: `Stage` and its identity, progress, parallelism, RNG
handling and DuckDB connections. Imports no stage."""
