"""Benchmark what a static model keeps of its teacher's quality on the user's corpus, and what training it
on the corpus (tokenlearn) adds over plain distillation (model2vec).

Runs --config (default configs/cpu/static_minilm.yaml: all-MiniLM-L6-v2 and its static model on the demo
corpus, scored by kNN over 10 splits, STS-B and SciFact retrieval) twice into one store with the `embforge
run` command: as it is (tokenlearn), then with `static.tokenlearn=false` (distillation only; the teacher's
scores come from the store). Then one comparison of the three models, as the report makes it: each score,
what each static model keeps of the teacher's, and every paired difference with its 95% interval (kNN
over the same splits, STS-B over the same pairs, retrieval over the same queries).
Usage:
    python benchmarks/static_quality.py [--config FILE] [--store DIR] [--set FIELD=VALUE ...]
Prints the table and the differences, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from flows.cli.common import run_entries
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.reporting.tables import comparison_table, long_rows, paired_differences, paired_lines

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ("knn_accuracy_splits", "sts_spearman")  # and each local MTEB task's main score


def run(config: str, store: str, sets: list[str]) -> tuple[str, float]:
    """The run id and wall seconds of `embforge run` with these settings."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", config, "--store", store,
                           *(a for s in sets for a in ("--set", s))], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"embforge run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return Catalog(ArtifactStore(store)).latest_run_id(), time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "cpu" / "static_minilm.yaml"))
    p.add_argument("--store", default=str(REPO / "embforge-store"))
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args()

    trained, trained_s = run(args.config, args.store, args.sets)
    distilled, distilled_s = run(args.config, args.store, [*args.sets, "static.tokenlearn=false"])
    catalog = Catalog(ArtifactStore(args.store))
    entries = run_entries(catalog, trained)
    teacher = entries[0]["label"]
    static = entries[-1]["label"]
    plain = f"{static}, distilled only"
    entries += [dict(e, label=plain) for e in run_entries(catalog, distilled) if e["label"] == static]

    table = comparison_table(catalog, entries)
    print(table.to_string(index=False))
    scores = long_rows(catalog, entries)
    scores = scores[scores["metric"].isin(HEADLINE) | scores["main_score"].notna()]
    value = {(r.model, r.metric): r.value for r in scores.itertuples() if r.value == r.value}
    kept = {model: {metric: value[(model, metric)] / value[(teacher, metric)] for (m, metric) in value
                    if m == model and (teacher, metric) in value} for model in (static, plain)}
    paired = paired_differences(catalog, entries)
    for line in paired_lines(paired):
        print(line)
    print(json.dumps(dict(config=args.config, teacher=teacher, models=[teacher, static, plain],
                          scores={f"{m} | {metric}": v for (m, metric), v in value.items()}, kept=kept,
                          paired=paired.to_dict("records"), run_s=dict(tokenlearn=trained_s, distilled=distilled_s)),
                     default=str))


if __name__ == "__main__":
    main()
