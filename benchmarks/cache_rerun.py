"""Benchmark: a second run of the same config is all cache hits and takes a fraction of the first.

Runs `embforge run CONFIG` twice on a fresh store, each in its own process as a user would,
and prints both wall times, the ratio and which stages were cached. Target: ratio <= 0.10.

    python benchmarks/cache_rerun.py [--config configs/demo.yaml]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from storage.catalog import Catalog
from storage.store import ArtifactStore

REPO = Path(__file__).resolve().parents[1]


def timed_run(config: str, store: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flows.cli", "run", config, "--store", str(store)],
                   cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        env = {**os.environ, "PREFECT_HOME": str(Path(tmp) / "prefect"), "HF_HUB_OFFLINE": "1"}
        first = timed_run(args.config, store, env)
        second = timed_run(args.config, store, env)
        catalog = Catalog(ArtifactStore(store))
        run_id = catalog.latest_run_id()
        states = catalog.query("SELECT state, count(*) AS n FROM run_stages WHERE run_id = ? GROUP BY state", [run_id])
    ratio = second / first
    summary = ", ".join("{n} {state}".format(**s) for s in states)
    print(f"config:      {args.config}")
    print(f"first run:   {first:8.1f} s (computes every stage)")
    print(f"second run:  {second:8.1f} s  stages: {summary}")
    print(f"ratio:       {ratio:8.3f}  (target <= 0.10)")
    print(json.dumps({"config": args.config, "first_s": round(first, 2), "second_s": round(second, 2),
                      "ratio": round(ratio, 4), "second_run_states": {s["state"]: s["n"] for s in states}}))


if __name__ == "__main__":
    main()
