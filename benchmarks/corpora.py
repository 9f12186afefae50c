"""The labelled corpora the benchmarks judge with (the shared data folder; its README gives sources and licences), as
files embforge reads: a corpus with empty texts (20 Newsgroups has posts that are all quote or header) is written
without them, once, into the folder beside the benchmark's store (the ingest stage keys a file by its path: one place
keeps every rerun's stages cached)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
LABELLED = {"demo": "configs/data/ohsumed_demo.parquet", "arxiv": "{data}/arxiv2007.parquet",
            "medical": "{data}/medical_abstracts.parquet", "newsgroups": "{data}/newsgroups20.parquet"}


def corpora_folder(store: str | Path) -> Path:
    """Where the corpora files a benchmark writes go: beside its store."""
    return Path(store).resolve().parent / "yardsticks-corpora"


def labelled_file(name: str, data: str | Path, folder: Path) -> Path:
    """The corpus `name` of LABELLED (`data`: the shared data folder), without its empty texts (in `folder`)."""
    path = REPO / LABELLED[name].format(data=data)
    docs = pd.read_parquet(path)
    if not (empty := docs["text"].fillna("").str.strip() == "").any():
        return path
    kept = folder / f"{name}-nonempty.parquet"
    if not kept.exists():
        folder.mkdir(parents=True, exist_ok=True)
        docs[~empty].to_parquet(kept, index=False)
    return kept
