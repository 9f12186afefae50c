"""Cut the evaluation slices shipped in configs/data from the team's normalised corpora.

The repo must run without /work/shared, so the small local MTEB-style tasks get their own copies:
SICK test, STS 2012-16, Twitter URL test without the undecided "tie" pairs, and a SciFact
retrieval slice (all test claims, every document relevant to them, random other documents up to
~2,000 so that retrieval still has distractors). Run from anywhere:

    python configs/data/make_slices.py [--source /work/shared/data]
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
SCIFACT_CORPUS_SIZE = 2_000
SEED = 0
log = logging.getLogger("make_slices")


def write(table: pd.DataFrame, name: str) -> None:
    table.reset_index(drop=True).to_parquet(HERE / name, compression="zstd", index=False)
    log.info("%s: %d rows, %.0f kB", name, len(table), (HERE / name).stat().st_size / 1e3)


def scifact_slice(source: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    qrels = pd.read_parquet(source / "scifact_qrels.parquet")
    corpus = pd.read_parquet(source / "scifact_corpus.parquet")
    queries = qrels[qrels["split"] == "test"]
    relevant = corpus["doc_id"].isin(queries["doc_id"])
    others = np.flatnonzero(~relevant.to_numpy())
    n_others = SCIFACT_CORPUS_SIZE - int(relevant.sum())
    keep = relevant.to_numpy().copy()
    keep[np.random.default_rng(SEED).choice(others, size=n_others, replace=False)] = True
    return corpus[keep], queries  # corpus order kept, so the file is stable across runs


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("/work/shared/data"))
    source = parser.parse_args().source

    sick = pd.read_parquet(source / "sick.parquet")
    write(sick[sick["split"] == "test"], "sick_test.parquet")

    shutil.copyfile(source / "sts12_16.parquet", HERE / "sts12_16.parquet")
    log.info("sts12_16.parquet: copied")

    twitter = pd.read_parquet(source / "twitter_url.parquet")
    write(twitter[(twitter["split"] == "test") & (twitter["subset"] != "tie")], "twitter_url_test.parquet")

    corpus, queries = scifact_slice(source)
    write(corpus, "scifact_test.parquet")
    write(queries, "scifact_test_queries.parquet")


if __name__ == "__main__":
    main()
