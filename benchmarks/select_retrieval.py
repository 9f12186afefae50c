"""Benchmark `embforge select` on a retrieval corpus, judged by queries the search never saw: SciFact's test claims.

`embforge select CORPUS` (default: configs/data/scifact_test.parquet, 2,000 SciFact abstracts) with --config (default
configs/select.yaml) decides on the titles (`evaluate.yardstick.kind=titles`: each held-out abstract's title finding
it) among the candidates of --families (default dense and multi_vector: every recipe that trains a family is tried as
it too). Then the untrained model (the config's start model), the answer and the runner-up at the last rung it
reached are judged on every claim of --queries (nDCG@10 over the whole corpus, through the same local MTEB retrieval
task `embforge run` scores, a multi-vector model by exact MaxSim): each against the untrained model, paired over the
claims.
Usage:
    python benchmarks/select_retrieval.py [--store DIR] [--families dense multi_vector] [--set FIELD=VALUE ...]
Prints a line per model, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from corpora import REPO
from select_recipe import embforge, evaluated_model, latest

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.base import BASE
from tasks.config.evaluation import LocalTaskConfig, MtebSettings
from tasks.metrics.mteb_tasks import evaluate_mteb
from tasks.metrics.significance import paired_difference
from tasks.select import decision_of, rung_name


def claims_ndcg(model: str, task: LocalTaskConfig, settings: MtebSettings, work: Path) -> dict[str, float]:
    """Each claim's nDCG@10 of `model` (a folder, or the package's name) over the whole corpus."""
    log = logging.getLogger("select_retrieval")
    with tempfile.TemporaryDirectory(dir=work) as results:
        scored = evaluate_mteb(model, "mean", settings, task, "cpu", Path(results), (Path(model).name, None), log)
    return scored.per_query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="configs/data/scifact_test.parquet")
    parser.add_argument("--queries", default="configs/data/scifact_test_queries.parquet")
    parser.add_argument("--config", default="configs/select.yaml")
    parser.add_argument("--store", default=str(Path(tempfile.gettempdir()) / "select-retrieval-store"))
    parser.add_argument("--families", nargs="+", default=["dense", "multi_vector"])
    parser.add_argument("--max-length", type=int, default=256, help="tokens a text is judged at")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="FIELD=VALUE")
    args = parser.parse_args()
    store, work = ArtifactStore(args.store), Path(args.store).resolve().parent
    out = work / "select-retrieval-answer"
    sets = [f"select.families=[{','.join(args.families)}]", "evaluate.yardstick.kind=titles", *args.sets]
    wall = embforge("select", str(REPO / args.corpus), "--config", args.config, "--store", args.store,
                    "--out", str(out), *[x for s in sets for x in ("--set", s)])
    catalog = Catalog(store)
    run_id = latest(catalog, "select")
    [row] = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'select'", [run_id])
    decided = ArtifactRef("select", row["key"])
    decision = decision_of(store.manifest(decided))
    ladder = store.read_table(decided, "ladder").to_pandas()
    reached = ladder.groupby("candidate")["steps"].max()
    roles = store.manifest(decided)["input_roles"]
    models = {BASE: evaluated_model(store, ArtifactRef("evaluate", roles["base"]))}  # a name, or a random init's folder
    scored = roles["scored"]  # each rung's evaluate artifact, by rung_name
    for name in dict.fromkeys(n for n in (decision.chosen, decision.runner_up) if n not in (BASE, None)):
        rung = rung_name(name, reached[name])
        models[rung] = evaluated_model(store, ArtifactRef("evaluate", scored[rung]))
    task = LocalTaskConfig(name="SciFact", type="retrieval", path=str(REPO / args.corpus),
                           queries=str(REPO / args.queries))
    settings = MtebSettings(max_length=args.max_length, batch_size=32)
    judged = {name: claims_ndcg(path, task, settings, work) for name, path in models.items()}
    claims = sorted(judged[BASE])
    figures = {}
    for name, per_query in judged.items():
        mean = sum(per_query.values()) / len(per_query)
        versus = paired_difference([per_query[c] for c in claims], [judged[BASE][c] for c in claims])
        figures[name] = dict(ndcg_at_10=mean, versus_base=dict(mean=versus.mean, low=versus.low, high=versus.high))
        print(f"{name}: nDCG@10 {mean:.3f} over {len(claims)} claims" + ("" if name == BASE else
              f"; against the untrained model {versus.mean:+.3f} [{versus.low:+.3f}, {versus.high:+.3f}]"))
    print(json.dumps(dict(chosen=decision.chosen, said=decision.said, search_s=round(wall, 1),
                          cost=store.manifest(decided)["extra"]["cost"], ladder=ladder.to_dict("records"),
                          judged=figures, date=time.strftime("%Y-%m-%d"))))


if __name__ == "__main__":
    main()
