"""Benchmark: time and peak memory of ingest → sentences → pairs, and of embed + kNN, as the corpus grows.

Issue 17. For each size N (default 10k, 100k and 1M documents) a synthetic corpus is written first:
the shared OHSUMED abstracts (../shared/data/ohsumed23.parquet, 7,400 rows) repeated with fresh
unique doc ids, text, title, label and split kept. Then a child process runs the three stages through
their own `Stage.run` (no Prefect flow) on a temporary store and reports seconds per stage and its
peak RSS (`ru_maxrss`: the whole process, interpreter and imports included). Where it embeds (100k
by default, any size with --knn) a second child embeds the documents with a small randomly
initialised BERT (2 layers, hidden 128, max length 128, on the CPU) and measures kNN accuracy on the
labelled documents read back from the embed artifact, so that peak is its own.

The stages run with configs/demo.yaml's settings: its `sentences` section and the pairs config of its
first crops-view method (PairsConfig.for_method with the demo's 3 epochs and kNN section), as
`embforge run` would build them. The random encoder's tokenizer is the demo model's.

Targets (issue 17, on the 2-core dev machine):
  - 1M documents through ingest → sentences → pairs with peak_rss_mb < 2048;
  - linear time: stages_s(1M) / stages_s(100k) ≤ 11 (`linear_ratio`, on the 1M line when both ran);
  - faster per document than before at 100k (then about 60 s for the three stages);
  - kNN over 100k stored embeddings with knn_peak_rss_mb < 2048.
Timings are of the machine it runs on; compare lines from the same machine only. Caveat: the corpus
repeats 7,400 texts, so anything that deduplicates equal strings (pyarrow → pandas does) holds less
than a real corpus of that size would; and each text recurs N / 7,400 times, so kNN finds copies of
its test documents among the training ones: knn_accuracy only shows that kNN ran, not model quality.
import_rss_mb is the child's peak after its imports (torch, transformers), before any stage ran.

    python benchmarks/corpus_scale.py                      # 10k, 100k (with embed + kNN), 1M
    python benchmarks/corpus_scale.py --docs 10000 --knn   # one size, with embed + kNN
    python benchmarks/corpus_scale.py --docs 100000 --docs 1000000

Prints ONE line of JSON per size (docs, ingest_s, sentences_s, pairs_s, stages_s, peak_rss_mb, and
where it embeds embed_s, knn_s, knn_accuracy, knn_peak_rss_mb).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `python benchmarks/corpus_scale.py` puts benchmarks/ first on sys.path, not the repo: without this,
# the editable install could import another checkout's stages.
sys.path.insert(0, str(REPO))

SOURCE = REPO.parent / "shared" / "data" / "ohsumed23.parquet"
CONFIG = REPO / "configs" / "demo.yaml"
SIZES = [10_000, 100_000, 1_000_000]
KNN_SIZES = {100_000}
CHUNK = 50_000  # rows per record batch when writing the corpus: the 1M corpus is never in memory
# Small enough that embedding 100k documents on 2 cores takes minutes, not hours.
ENCODER = {"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512, "seed": 0}
MAX_LENGTH, BATCH = 128, 128


def write_corpus(n: int, path: Path, source: Path = SOURCE) -> None:
    """n documents: the source rows in order, again and again, each with a fresh doc_id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(source, columns=["doc_id", "title", "text", "label", "split"])
    # No dictionary for the texts: the file is then as large as one of n distinct abstracts, not 7,400.
    with pq.ParquetWriter(path, rows.schema, use_dictionary=["label", "split"]) as writer:
        for start in range(0, n, CHUNK):
            ids = range(start, min(start + CHUNK, n))
            batch = rows.take(pa.array([i % rows.num_rows for i in ids]))
            batch = batch.set_column(0, "doc_id", pa.array([f"syn{i:07d}" for i in ids], pa.string()))
            writer.write_table(batch)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def demo_config():
    from tasks.config.loading import load_config

    return load_config(CONFIG)


def ingest(store, corpus: Path, n: int):
    from tasks.config.data import DataConfig
    from tasks.core.stage import NoInputs
    from tasks.ingest import INGEST

    return INGEST.run(store, DataConfig(path=str(corpus), name=f"ohsumed-x{n}"), NoInputs())


def child_stages(n: int, corpus: Path, store_root: Path) -> dict:
    """ingest → sentences → pairs, each timed; the peak RSS of this process."""
    from storage.store import ArtifactStore
    from tasks.pairs import PAIRS, PairsConfig, PairsInputs
    from tasks.sentences import SENTENCES, SentencesInputs

    cfg = demo_config()
    method = next(m for m in cfg.methods if PairsConfig.for_method(m, 1).view == "crops")
    views = PairsConfig.for_method(method, cfg.train_for(method).epochs, cfg.evaluate.knn)
    store = ArtifactStore(store_root)
    result: dict = {"docs": n, "import_rss_mb": peak_rss_mb()}

    start = time.perf_counter()
    docs = ingest(store, corpus, n)
    result["ingest_s"] = time.perf_counter() - start
    result["ingest_rss_mb"] = peak_rss_mb()

    start = time.perf_counter()
    sentences = SENTENCES.run(store, cfg.sentences, SentencesInputs(documents=docs))
    result["sentences_s"] = time.perf_counter() - start
    result["sentences_rss_mb"] = peak_rss_mb()

    start = time.perf_counter()
    pairs = PAIRS.run(store, views, PairsInputs.for_view(views, sentences, docs, None))
    result["pairs_s"] = time.perf_counter() - start
    result["peak_rss_mb"] = peak_rss_mb()

    result["stages_s"] = result["ingest_s"] + result["sentences_s"] + result["pairs_s"]
    # Counts from the manifests only: reading the tables back would add to the peak.
    result["kept_sentences"] = store.manifest(sentences)["extra"].get("kept")
    result["pair_docs"] = store.manifest(pairs)["extra"].get("documents")
    result["epochs"] = views.epochs
    return result


def child_knn(n: int, corpus: Path, store_root: Path) -> dict:
    """Embed every document with a small random encoder, then kNN accuracy on the labelled ones."""
    import numpy as np
    import pyarrow.compute as pc

    from storage.store import ArtifactStore
    from tasks.config.evaluation import KnnConfig
    from tasks.core.stage import NoInputs
    from tasks.embed import EMBED, EmbedInputs, EmbedJob, read_embeddings
    from tasks.init import INIT, InitConfig
    from tasks.metrics.knn import knn_accuracy

    store = ArtifactStore(store_root)
    docs = ingest(store, corpus, n)  # the stages child built it: a cache hit
    model = INIT.run(store, InitConfig(tokenizer=demo_config().model.name_or_path, **ENCODER), NoInputs())
    result: dict = {}

    start = time.perf_counter()
    emb = EMBED.run(store, EmbedJob(max_length=MAX_LENGTH, batch_size=BATCH, device="cpu"),
                    EmbedInputs(documents=docs, model=model))
    result["embed_s"] = time.perf_counter() - start
    result["embed_rss_mb"] = peak_rss_mb()

    start = time.perf_counter()
    knn = KnnConfig()
    labels = store.read_table(docs, "documents")["label"]
    labelled = np.flatnonzero(pc.is_valid(labels).to_numpy(zero_copy_only=False))
    x = read_embeddings(store, emb, "mean")[labelled]
    accuracy, tested = knn_accuracy(x, labels.take(labelled).to_numpy(zero_copy_only=False), knn.k,
                                    knn.test_size, knn.seed)
    result["knn_s"] = time.perf_counter() - start
    result.update(knn_accuracy=round(accuracy, 4), knn_test_docs=tested, knn_peak_rss_mb=peak_rss_mb())
    return result


def run_child(kind: str, n: int, corpus: Path, store: Path, env: dict, verbose: bool) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--docs", str(n),
           "--corpus", str(corpus), "--store", str(store)] + (["--verbose"] if verbose else [])
    done = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        return {"error": f"{kind} child exited with {done.returncode} (its stderr is above)"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounded(result: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, action="append", help="a size to run (repeatable; default: "
                        + ", ".join(map(str, SIZES)) + ")")
    parser.add_argument("--knn", action="store_true", help="embed + kNN at every size (default: at 100k only)")
    parser.add_argument("--no-knn", action="store_true", help="never embed")
    parser.add_argument("--workdir", help="where corpora and stores go (default: a temp folder, removed after)")
    parser.add_argument("--verbose", action="store_true", help="the stages' log lines on stderr")
    parser.add_argument("--child", choices=["stages", "knn"], help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # one measurement in this fresh process; its JSON line goes to the parent
        import logging

        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
        child = child_stages if args.child == "stages" else child_knn
        print(json.dumps(child(args.docs[0], args.corpus, args.store)))
        return

    sizes = args.docs or SIZES
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="corpus_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "HF_HUB_OFFLINE": "1"}
    if not args.verbose:  # progress bars (embed, model loading) would bury the JSON lines
        env.update(TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")
    stages_s: dict[int, float] = {}
    failed = False
    try:
        for n in sizes:
            corpus, store = work / f"corpus_{n}.parquet", work / f"store_{n}"
            start = time.perf_counter()
            write_corpus(n, corpus)  # here, before the child starts: its rows are not in the child's peak
            result = {"docs": n, "corpus_write_s": time.perf_counter() - start,
                      "corpus_mb": round(corpus.stat().st_size / 2**20, 1),
                      **run_child("stages", n, corpus, store, env, args.verbose)}
            if "error" not in result and not args.no_knn and (args.knn or n in KNN_SIZES):
                result.update(run_child("knn", n, corpus, store, env, args.verbose))
            if "stages_s" in result:
                stages_s[n] = result["stages_s"]
                result["docs_per_s"] = round(n / result["stages_s"])
            if n == 1_000_000 and 100_000 in stages_s and n in stages_s:
                result["linear_ratio"] = round(stages_s[n] / stages_s[100_000], 3)  # target ≤ 11
            failed |= "error" in result
            print(json.dumps(rounded(result)), flush=True)
            if not args.workdir:  # a 1M store is several GB: free it before the next size
                shutil.rmtree(store, ignore_errors=True)
                corpus.unlink(missing_ok=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
