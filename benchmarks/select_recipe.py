"""Benchmark `embforge select` against training every candidate fully, judged with the labels the search never saw.

For each corpus (default: the demo's OHSUMED abstracts, arXiv 2007 and medical abstracts, each with titles and
labels): `embforge select CORPUS` with --config (default configs/select.yaml, its kNN off) on the yardstick
--yardstick (default `titles`: the labels judge a choice made without them), then an exhaustive `embforge run` of the
same candidates (every recipe x learning rate on the same `select.budget`-step schedule, `train.max_steps`, over the
epochs the search gave each) scored by labelled kNN accuracy over 10 splits and by the same yardstick. Reports per
corpus: the selected model's kNN against the best candidate's, paired over the splits (the target: within the interval
or above) and against the untrained model's, the search's training steps against the exhaustive run's (target <=
35%), Kendall's tau between the yardstick's ranking of the candidates and kNN's, and the search's wall time.
With --judge answer nothing is trained after the search: its own models (the answer, the untrained model, every rung's
candidates) are judged by kNN from the document embeddings it stored (the corpus it ranked: a sample of a large one,
`knn_documents` of them labelled).
Usage:
    python benchmarks/select_recipe.py [--corpora demo arxiv medical newsgroups] [--config FILE] [--store DIR]
                                [--limit N] [--data DIR] [--judge all|answer]
                                [--yardstick titles|labels|qrels|neighbours|...] [--set FIELD=VALUE ...]
Prints a line per corpus, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
from corpora import LABELLED, REPO, corpora_folder, labelled_file
from scipy import stats

from flows.cli.common import overrides
from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.base import BASE
from tasks.config.evaluation import YARDSTICK_METRICS
from tasks.config.loading import load_config
from tasks.config.yardsticks import YARDSTICKS
from tasks.embed import read_embeddings
from tasks.encoders.models import model_path
from tasks.metrics.knn import knn_accuracy_splits
from tasks.metrics.pool import pool_scores
from tasks.metrics.significance import paired_difference
from tasks.reporting.tables import PER_SPLIT
from tasks.select import rung_name

KNN = {"k": 10, "test_size": 0.1, "seed": 42, "repeats": 10}
TARGET_SHARE = 0.35


def embforge(*argv: str) -> float:
    """Run an embforge command; its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.cli", *argv], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"embforge {argv[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - start


def evaluated_model(store: ArtifactStore, evaluated: ArtifactRef) -> str:
    """What an evaluate artifact scored: the folder of the train (merge, init) artifact it read, or the external
    model's name."""
    manifest = store.manifest(evaluated)
    key = manifest["input_roles"].get("model")
    if not key:
        return manifest["config"]["model"]
    address = next(a for a in manifest["input_files"] if a.endswith(f"/{key}"))
    return model_path(store, ArtifactRef.parse(address))


def latest(catalog: Catalog, flow: str) -> str:
    return catalog.query("SELECT run_id FROM runs WHERE flow = ? ORDER BY started_at DESC LIMIT 1", [flow])[0]["run_id"]


def scores(catalog: Catalog, run_id: str, metric: str) -> dict[str, list[float]]:
    """Each model of a run: its values of `metric`, in split order (one value for a metric without splits)."""
    rows = catalog.query("SELECT s.label, m.value FROM run_stages s JOIN metrics m ON m.key = s.key WHERE "
                         "s.run_id = ? AND s.stage = 'evaluate' AND m.metric = ? ORDER BY s.label, m.split",
                         [run_id, metric])
    found: dict[str, list[float]] = {}
    for r in rows:
        found.setdefault(r["label"], []).append(r["value"])
    return found


def stored_knn(store: ArtifactStore, catalog: Catalog, run_id: str) -> tuple[dict[str, list[float]], int]:
    """Each model a run scored (by label): its kNN accuracy on each of KNN's splits, from the documents and embeddings
    its evaluate stage read (nothing trained or embedded again; the labels the documents carry); and how many
    labelled documents that is."""
    found, labelled = {}, 0
    for r in catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'evaluate'", [run_id]):
        manifest = store.manifest(ArtifactRef("evaluate", r["key"]))
        roles = manifest["input_roles"]
        [stage] = [a["stage"] for a in catalog.query("SELECT stage FROM artifacts WHERE key = ?", [roles["documents"]])]
        y = store.read_table(ArtifactRef(stage, roles["documents"]), "documents", ["label"])["label"].to_pandas()
        x = read_embeddings(store, ArtifactRef("embed", roles["embeddings"]), manifest["config"]["pooling"])
        found[r["label"]] = knn_accuracy_splits(x[y.notna().to_numpy()], y.dropna().to_numpy(), KNN["k"],
                                                KNN["test_size"], range(KNN["repeats"]))
        labelled = int(y.notna().sum())
    return found, labelled


def rungs(ladder: pd.DataFrame, knn: dict[str, list[float]], total: int) -> list[dict]:
    """Each rung of the search: every candidate scored there, its yardstick score beside its labelled kNN, and
    Kendall's tau between the two over the rung (three candidates or more)."""
    out = []
    for steps, rung in ladder[ladder["score"].notna()].groupby("steps"):
        labels = [c if steps == total else rung_name(c, steps) for c in rung["candidate"]]
        means = [mean(knn[label]) for label in labels]
        tau = stats.kendalltau(rung["score"], means).statistic if len(labels) > 2 else None
        out.append(dict(steps=int(steps), tau=tau, yardstick=dict(zip(labels, rung["score"])),
                        knn=dict(zip(labels, means))))
    return out


def one_corpus(name: str, path: Path, args: argparse.Namespace, work: Path) -> dict:
    sets = [*args.sets, *([f"data.limit={args.limit}"] if args.limit else []), f"name=select-{name}",
            f"evaluate.yardstick.kind={args.yardstick}"]
    changes = overrides(sets)
    cfg = load_config(args.config, {**changes, "data.path": str(path)})
    store_args = ["--store", args.store]
    select_s = embforge("select", str(path), "--config", args.config, "--out", str(work / name), *store_args,
                        *(a for s in sets for a in ("--set", s)))
    store = ArtifactStore(args.store)
    catalog = Catalog(store)
    searched = latest(catalog, "select")
    decided = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'select'", [searched])[0]["key"]
    manifest = store.manifest(ArtifactRef("select", decided))
    extra = manifest["extra"]
    ladder = store.read_table(ArtifactRef("select", decided), "ladder").to_pandas()
    chosen = extra["decision"]["chosen"]
    cost = dict(search_steps=extra["cost"]["trained_steps"], exhaustive_steps=extra["cost"]["exhaustive_steps"],
                share=extra["cost"]["share"], select_s=round(select_s, 1),
                # what decided against the untrained model (a pooled kind's confirming kind, or None) and its interval
                confirmed_by=extra["decision"].get("confirmed_by"), decided_by=extra["decision"]["versus_base"])
    if args.judge == "answer":
        return judged_from_search(name, store, catalog, searched, manifest["config"], ladder, chosen, cost)
    # Every candidate trained fully on the schedule the search put it on (its view's epochs, as the pairs stage drew
    # them for the search's budget).
    epochs = {r["method"]: store.manifest(ArtifactRef("pairs", r["key"]))["extra"]["epochs"] for r in catalog.query(
        "SELECT label AS method, key FROM run_stages WHERE run_id = ? AND stage = 'pairs'", [searched])}
    trained = ladder[["candidate", "recipe", "lr"]].drop_duplicates()
    methods = [dict(name=c, recipe=r, train=dict(lr=lr, epochs=epochs[c], max_steps=cfg.select.budget,
                                                   on_unhealthy="warn"))
               for c, r, lr in trained.itertuples(index=False)]
    exhaustive_s = embforge("run", args.config, *store_args, *(a for s in sets for a in ("--set", s)),
                            "--set", f"data.path={path}", "--set", f"methods={json.dumps(methods)}",
                            "--set", f"evaluate.knn={json.dumps(KNN)}")
    catalog = Catalog(store)  # the runs since
    full = latest(catalog, "pipeline")
    knn = scores(catalog, full, PER_SPLIT)
    if YARDSTICKS[args.yardstick].pooled:  # the fully trained candidates and the untrained model judge each other
        pool = {r["label"]: ArtifactRef("evaluate", r["key"]) for r in catalog.query(
            "SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'evaluate'", [full])}
        yardstick = {label: float(v.mean()) for label, v in pool_scores(store, pool).items()}
    else:
        yardstick = {label: v[0] for label, v in scores(catalog, full, YARDSTICK_METRICS[args.yardstick]).items()}
    candidates = [m["name"] for m in methods]
    base = next(label for label in knn if label.startswith("base"))
    selected = base if chosen == BASE else chosen
    over_base = paired_difference(knn[selected], knn[base])  # a trained answer: does it beat its start on the labels?
    best = max(candidates, key=lambda c: sum(knn[c]))
    d = paired_difference(knn[selected], knn[best])
    tau = stats.kendalltau([yardstick[c] for c in candidates], [sum(knn[c]) for c in candidates]).statistic
    row = dict(corpus=name, documents=documents(store, catalog, full),
               chosen=chosen, best=best, selected_knn=mean(knn[selected]), best_knn=mean(knn[best]),
               base_knn=mean(knn[base]), difference=d.mean, low=d.low, high=d.high, within=d.high >= 0,
               over_base=dict(mean=over_base.mean, low=over_base.low, high=over_base.high),
               kendall_tau=tau, **cost, exhaustive_s=round(exhaustive_s, 1),
               yardstick={c: yardstick.get(c) for c in candidates}, knn={c: mean(knn[c]) for c in candidates})
    print(f"{name}: selected {chosen} (kNN {row['selected_knn']:.3f}), best {best} ({row['best_knn']:.3f}): "
          f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}]; Kendall's tau {tau:+.2f}; over the base "
          f"{over_base.mean:+.3f} [{over_base.low:+.3f}, {over_base.high:+.3f}]; {row['share']:.0%} of the exhaustive "
          f"steps; select {select_s / 60:.1f} min", flush=True)
    return row


def judged_from_search(name: str, store: ArtifactStore, catalog: Catalog, searched: str, job: dict,
                       ladder: pd.DataFrame, chosen: str, cost: dict) -> dict:
    """--judge answer: the search's own models judged by the labels, from the embeddings it stored: the answer
    (trained to the budget by the search, or the untrained model) against the untrained model, and each rung."""
    knn, labelled = stored_knn(store, catalog, searched)
    base = job["base"]
    selected = base if chosen == BASE else chosen
    over_base = paired_difference(knn[selected], knn[base])
    row = dict(corpus=name, documents=documents(store, catalog, searched), knn_documents=labelled, chosen=chosen,
               best=None, selected_knn=mean(knn[selected]), best_knn=None, base_knn=mean(knn[base]), difference=None,
               low=None, high=None, within=None, over_base=dict(mean=over_base.mean, low=over_base.low,
                                                                  high=over_base.high),
               kendall_tau=None, **cost, exhaustive_s=None, rungs=rungs(ladder, knn, job["total"]))
    taus = ", ".join(f"{r['steps']} steps {r['tau']:+.2f}" for r in row["rungs"] if r["tau"] is not None)
    print(f"{name}: selected {chosen} (kNN {row['selected_knn']:.3f}), over the base {over_base.mean:+.3f} "
          f"[{over_base.low:+.3f}, {over_base.high:+.3f}]; the rungs' Kendall's tau: {taus or 'none'}; "
          f"{row['share']:.0%} of the exhaustive steps; select {cost['select_s'] / 60:.1f} min", flush=True)
    return row


def documents(store: ArtifactStore, catalog: Catalog, run_id: str) -> int:
    """The documents a run ingested."""
    ingest = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'ingest'", [run_id])[0]["key"]
    return store.manifest(ArtifactRef("ingest", ingest))["rows"]["documents"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpora", nargs="+", default=["demo", "arxiv", "medical"], choices=list(LABELLED))
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--config", default=str(REPO / "configs" / "select.yaml"))
    p.add_argument("--store", default=str(REPO.parent / "embforge-store"))
    p.add_argument("--limit", type=int, help="only the first N documents of each corpus")
    p.add_argument("--yardstick", choices=list(YARDSTICK_METRICS), default="titles",
                   help="what decides (evaluate.yardstick.kind; qrels with --set evaluate.yardstick.qrels=FILE); kNN "
                   "on the labels judges")
    p.add_argument("--judge", choices=["all", "answer"], default="all",
                   help="all: train every candidate fully (the exhaustive run); answer: train nothing more, judge "
                   "the search's own models (the answer against the untrained model, and every rung: kNN beside "
                   "the yardstick, Kendall's tau per rung) from the document embeddings it stored (best, "
                   "difference and the exhaustive tau are then null)")
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = [one_corpus(name, labelled_file(name, args.data, corpora_folder(args.store)), args, Path(work))
                for name in args.corpora]
    print(json.dumps(dict(corpora=rows, all_within=all(r["within"] for r in rows) if args.judge == "all" else None,
                          max_share=max(r["share"] for r in rows), target_share=TARGET_SHARE,
                          config=str(args.config), yardstick=args.yardstick, sets=args.sets)))


if __name__ == "__main__":
    main()
