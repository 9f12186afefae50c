"""Is a model's kNN lead on 20 Newsgroups its topic grouping, or the posts' headers? The yardsticks pool re-judged.

Each model of a stored `benchmarks/yardsticks.py` run on 20 Newsgroups (--store: its store) embeds the posts again
cleaned by each rule of --rules (tasks/ingest.py's `strip_mail`; the rules fixed before any result was read), at the
evaluate stage's 128 tokens: `senders_and_quotes`, attribution lines ("... writes:"), e-mail addresses and quoted
lines (starting with >, | or :) removed (`data.strip_mail` with `data.strip_quotes`); `senders`, attribution lines
and addresses alone (`data.strip_mail`); `quotes`, quoted lines alone. kNN accuracy (k 10, ten 90/10 splits, the
labels) on each, beside the raw posts' kNN and every yardstick's scores as the yardsticks run's final JSON line has
them (--scores: a file holding its output); then each yardstick's Kendall tau and one-sided permutation p against
each rule's kNN.
Usage:
    python benchmarks/newsgroups_cleaned.py --store DIR --scores FILE [--docs 2000] [--rules senders_and_quotes ...]
Prints a line per model and per yardstick, then ONE final line of JSON.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats
from select_recipe import evaluated_model
from yardsticks import permutation_tau, pooled, stored_run

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.encoders.encode import encoder_at
from tasks.ingest import strip_mail
from tasks.metrics.knn import knn_accuracy_splits

RULES = {"senders_and_quotes": dict(quotes=True), "senders": dict(), "quotes": dict(quotes=True, senders=False)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True)
    p.add_argument("--scores", required=True, help="a file ending with benchmarks/yardsticks.py's JSON line")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    args = p.parse_args()
    store = ArtifactStore(args.store)
    catalog = Catalog(store)
    models = pooled(store, catalog, stored_run(catalog, "newsgroups", "titles", args.docs))
    labels = sorted(models)
    row = json.loads(open(args.scores).read().strip().splitlines()[-1])
    run = next(c for c in row["corpora"] if c["corpus"] == "newsgroups")
    raw = run["truth"]  # the raw posts' kNN: the mean of the stored run's ten splits
    roles = models[labels[0]]["manifest"]["input_roles"]
    posts = store.read_table(ArtifactRef("ingest", roles["documents"]), "documents", columns=["text", "label"])
    y = np.array(posts["label"].to_pylist())
    texts = {rule: [strip_mail(t, **RULES[rule]) for t in posts["text"].to_pylist()] for rule in args.rules}
    clean: dict[str, dict[str, float]] = {rule: {} for rule in args.rules}
    for m in labels:
        encoder = encoder_at(evaluated_model(store, ArtifactRef("evaluate", models[m]["manifest"]["key"])), "cpu",
                             models[m]["pooling"])
        for rule in args.rules:
            vectors = encoder.encode(texts[rule], max_length=128)
            clean[rule][m] = float(np.mean(knn_accuracy_splits(vectors, y, 10, 0.1, range(10))))
        print(f"  {m:<40} kNN raw {raw[m]:.4f}  " + "  ".join(f"{r} {clean[r][m]:.4f}" for r in args.rules), flush=True)
    tau, agreement = {}, {}
    for rule in args.rules:
        truth = np.array([clean[rule][m] for m in labels])
        tau[rule] = {y_: permutation_tau(truth, np.array([s[m] for m in labels]), 10_000)
                     for y_, s in run["scores"].items()}
        agreement[rule] = float(stats.kendalltau([raw[m] for m in labels], truth).statistic)
        for y_, (t, pv) in tau[rule].items():
            print(f"  {rule:<18} {y_:<18} tau {t:+.2f} (p {pv:.4f}) against its kNN")
    print(json.dumps(dict(raw=raw, cleaned=clean, raw_against_cleaned=agreement,
                          tau={r: {y_: t for y_, (t, _) in v.items()} for r, v in tau.items()},
                          p={r: {y_: pv for y_, (_, pv) in v.items()} for r, v in tau.items()})))


if __name__ == "__main__":
    main()
