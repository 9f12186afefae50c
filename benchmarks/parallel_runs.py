"""Benchmark: stages side by side through a task runner vs one after another, in one run.

1. Training: every recipe of configs/cpu/all_recipes_random.yaml, shortened (a slice of the corpus,
   one epoch), run sequentially and on RUNNER with 2 workers, each on a fresh store.
2. Re-scoring: 3 models registered by the sequential run, scored by the `evaluate` flow on the
   demo's benchmark set (kNN, STS and its local MTEB tasks), sequentially and on RUNNER, each on
   its own copy of that store.

Every run is its own `embforge` process with its own PREFECT_HOME, as a user would start it. The
numbers must match between runners; the JSON line gives wall times and sequential / parallel.

    python benchmarks/parallel_runs.py [--runner processes|dask|threads] [--limit 400]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from storage.catalog import Catalog
from storage.store import ArtifactStore

REPO = Path(__file__).resolve().parents[1]
TRAIN_CONFIG = "configs/cpu/all_recipes_random.yaml"
SCORE_CONFIG = "configs/demo.yaml"
RESCORED = ["crops", "dropout", "simcse"]
METRICS = "SELECT model, dataset, metric, layer, value FROM metrics ORDER BY ALL"


def timed(args: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def train_run(store: Path, runner: str, limit: int, env: dict) -> float:
    settings = {"run.task_runner": runner, "run.max_workers": 2, "data.limit": limit, "train.epochs": 1,
                "train.eval_every": None, "evaluate.knn.repeats": 3, "evaluate.layerwise": False}
    return timed(["-m", "flows.cli", "run", TRAIN_CONFIG, "--store", str(store),
                  *(arg for k, v in settings.items() for arg in ("--set", f"{k}={json.dumps(v)}"))], env)


def rescore_run(store: Path, runner: str, limit: int, env: dict) -> float:
    overrides = {"run.task_runner": runner, "run.max_workers": 2, "data.limit": limit,
                 "evaluate.layerwise": False, "evaluate.reference_models": [], "evaluate.mteb.tasks": []}
    code = ("from flows.evaluate_registered import evaluate; from flows.params import EvaluateParams; "
            f"evaluate(EvaluateParams(config={SCORE_CONFIG!r}, store={str(store)!r}, overrides={overrides!r}, "
            f"models={RESCORED!r}))")
    return timed(["-c", f"if __name__ == '__main__': {code}"], env)


def metrics(store: Path) -> list[dict]:
    return Catalog(ArtifactStore(store)).query(METRICS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", default="processes", choices=["threads", "processes", "dask"])
    parser.add_argument("--limit", type=int, default=400, help="documents of the corpus to train and score on")
    args = parser.parse_args()
    result = {"runner": args.runner, "workers": 2, "cores": len(os.sched_getaffinity(0)), "limit": args.limit}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "HF_HUB_OFFLINE": "1"}
        train = {runner: train_run(tmp / f"train-{runner}", runner, args.limit, env)
                 for runner in ("sequential", args.runner)}
        same_training = metrics(tmp / "train-sequential") == metrics(tmp / f"train-{args.runner}")
        # Both copies hold the trained models and their training scores: only the new scoring runs.
        for runner in ("sequential", args.runner):
            shutil.copytree(tmp / "train-sequential", tmp / f"score-{runner}")
        score = {runner: rescore_run(tmp / f"score-{runner}", runner, args.limit, env)
                 for runner in ("sequential", args.runner)}
        same_scores = metrics(tmp / "score-sequential") == metrics(tmp / f"score-{args.runner}")
    for name, times in (("train_all_recipes", train), ("rescore_3_models", score)):
        ratio = times["sequential"] / times[args.runner]
        print(f"{name:18s} sequential {times['sequential']:7.1f} s   {args.runner} {times[args.runner]:7.1f} s   "
              f"speed-up {ratio:.2f}x (2 workers)")
        result[name] = {"sequential_s": round(times["sequential"], 1), "parallel_s": round(times[args.runner], 1),
                        "speedup": round(ratio, 3)}
    result["same_metrics"] = same_training and same_scores
    print(json.dumps(result))


if __name__ == "__main__":
    main()
