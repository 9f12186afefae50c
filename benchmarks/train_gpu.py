"""GPU-grade training throughput: embforge's loop against sentence-transformers' Trainer, side by side.

The crops recipe on demo-corpus rows, sequence length 128, batch 64 and 512 (the latter cached in
mini-batches: `train.mini_batch_size`, GradCache; the Trainer then uses CachedMNRL with the same
mini-batch). embforge trains with `precision: auto` (bf16 on a GPU), the Trainer with `bf16=True`
on a GPU (fp32 on a CPU) and MultipleNegativesRankingLoss (scale 20 = τ 0.05): the same model,
rows in the same order, the same batch. The two sides alternate over --rounds rounds, each going
first in every other round, so that machine noise does not decide the ratio; the ratio is of the
medians.

Models: `bert-base` (12 layers, 768 wide, random init with MiniLM's tokenizer; the default on a
GPU), `minilm` (all-MiniLM-L6-v2) and `random-small` (random 2 x 256; these two are the default on a
CPU), and `random-tiny` (random 1 x 32: the tests' smoke run, whose compiles take seconds).
Reported: tokens/s (non-padding tokens of both sides of the pairs), model FLOP utilisation = 6 x
parameters x tokens/s / the GPU's peak dense bf16 FLOP/s (none on a CPU), peak GPU memory, and
embforge / Trainer, for embforge padded, padding-free (`train.padding_free`) and, with --compile,
compiled (`train.compile`) padded and padding-free, and with --cuda-graphs compiled padded with CUDA
graphs (`train.compile: cuda_graphs`; on a CPU the same as compiled). Each side runs once untimed
first, over the same rows (a GPU's first run pays for library set-up, and each sequence length's
first batch for choosing its kernels). --profile splits each embforge side's step and, on CUDA,
gives the share of a step the GPU is busy (kernels and copies, torch's profiler). --ceiling times
the bare step (the encoder twice, InfoNCE, backward, AdamW) on full-length batches of random tokens,
every one real: eager as embforge trains, with bf16 weights, compiled, and on CUDA compiled with
CUDA graphs; the gap between it and the loop is what the loop and its padding cost.

Usage: python benchmarks/train_gpu.py [--models bert-base,minilm] [--batches 64,512] [--steps N]
                                      [--rounds N] [--mini-batch-size 64] [--device auto] [--profile]
                                      [--compile] [--cuda-graphs] [--ceiling]
Prints a table, then ONE final line of JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import torch
from rich.console import Console
from rich.table import Table
from train_step import (
    WARMUP,
    alternating,
    demo_rows,
    pairs_per_second,
    prepared_ahead,
    step_split,
    time_recipe,
    time_st_trainer,
)
from transformers import AutoTokenizer

from storage.store import ArtifactStore
from tasks.config.base import DEFAULT_MODEL
from tasks.config.model import RandomInitConfig
from tasks.config.training import TrainConfig
from tasks.encoders import precision
from tasks.encoders.models import load_model, pick_device, save_random_encoder, sentence_model
from tasks.methods.infonce import info_nce
from tasks.methods.training import StepTimes

PEAK_BF16_TFLOPS = {"H100": 989, "H200": 989, "A100": 312}  # dense, SXM
MODELS = {"bert-base": RandomInitConfig(layers=12, hidden=768, heads=12, intermediate=3072),
          "random-small": RandomInitConfig(), "minilm": None,
          "random-tiny": RandomInitConfig(layers=1, hidden=32, heads=2, intermediate=64)}


def mfu(params: int, tokens_per_s: float, peak: float | None) -> float | None:
    """Model FLOP utilisation: 6 x parameters FLOPs per token (forward and backward) over the peak; None on a CPU."""
    return round(6 * params * tokens_per_s / peak, 3) if peak else None


def peak_flops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops * 1e12 for gpu, tflops in PEAK_BF16_TFLOPS.items() if gpu in name), None)


def tokens_per_row(rows: pa.Table, max_length: int) -> list[int]:
    """Non-padding tokens of each (anchor, positive) row after truncation."""
    tokenizer = load_model(DEFAULT_MODEL, AutoTokenizer.from_pretrained)
    sides = [tokenizer(rows[c].to_pylist(), truncation=True, max_length=max_length)["input_ids"]
             for c in ("anchor", "positive")]
    return [len(a) + len(p) for a, p in zip(*sides)]


def model_folder(name: str, work: Path) -> str:
    if MODELS[name] is None:
        return DEFAULT_MODEL
    folder = work / name
    if not folder.exists():
        save_random_encoder(DEFAULT_MODEL, MODELS[name], folder)
    return str(folder)


def measure(side: dict | None, model: str, rows: pa.Table, cfg: TrainConfig, steps: int,
            work: Path) -> tuple[float, float | None]:
    """(pairs/s over the timed steps, peak GPU memory in GB; None on a CPU) of embforge with the
    train settings `side`, or of the Trainer (None)."""
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if side is not None:
        stamps = time_recipe("crops", model, cfg.model_copy(update=side), rows, work)
    else:
        stamps = time_st_trainer(model, rows, cfg, steps, work, bf16=cfg.device.startswith("cuda"))
    memory = torch.cuda.max_memory_allocated() / 1e9 if cfg.device.startswith("cuda") else None
    return pairs_per_second(stamps, cfg.batch_size), memory


def kernel_seconds_per_step(model: str, rows: pa.Table, cfg: TrainConfig, steps: int, work: Path) -> float:
    """Seconds per timed step of embforge's crops during which the GPU runs a kernel or a copy
    (torch's profiler; overlapping ones counted once)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True,
                 schedule=schedule(wait=0, warmup=WARMUP, active=steps)) as prof:  # acc: kept past the cycle
        time_recipe("crops", model, cfg, rows, work, after_step=prof.step)
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()  # not the steps' annotations,
                   if e.device_type != torch.autograd.DeviceType.CPU and not e.is_user_annotation)  # idle included
    busy, reach = 0.0, float("-inf")
    for start, end in spans:  # the union of the intervals, in µs
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return busy / 1e6 / steps


def profile_split(model: str, rows: pa.Table, cfg: TrainConfig, steps: int, work: Path,
                  step_seconds: float) -> dict:
    """Where a step goes (the loop's marks; CUDA synchronised at each) and, on a GPU, the share of an
    unprofiled step (`step_seconds`, from the rounds) that the GPU is busy."""
    profile = StepTimes(cfg.device)
    time_recipe("crops", model, cfg, rows, work, profile)
    split = {part: round(s, 4) for part, s in step_split(profile).items()}
    busy = (kernel_seconds_per_step(model, rows, cfg, steps, work) / step_seconds
            if cfg.device.startswith("cuda") else None)
    return {"step_split_s": split, "prepared_ahead_s": round(prepared_ahead(profile), 4),
            "gpu_busy": None if busy is None else round(busy, 3)}


CEILINGS = ("eager", "bf16_weights", "compiled", "cudagraphs")  # the last on CUDA only


def ceiling(model: str, batch: int, max_length: int, device: str, how: str, steps: int) -> float:
    """Seconds per bare step on full-length batches of random tokens, every one real: the encoder on two
    sides, InfoNCE, backward and fused AdamW, nothing around it (no data, logging or health checks).
    `how`: eager (autocast over float32 weights, as embforge trains), bf16_weights (the weights in bf16,
    no autocast), compiled (torch.compile, static shapes) or cudagraphs (compiled, CUDA graphs replayed)."""
    torch.manual_seed(0)
    setting = {"compiled": True, "cudagraphs": "cuda_graphs"}.get(how, False)  # train.compile's
    encoder = sentence_model(model, max_length, device, compile=setting)
    if how == "bf16_weights":
        encoder.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-5, fused=True)
    dtype = torch.float32 if how == "bf16_weights" else precision.autocast_dtype("auto", device)
    amp = precision.autocast(device, dtype)
    sides = [{"input_ids": torch.randint(1000, 20000, (batch, max_length), device=device),  # [batch, length] each
              "attention_mask": torch.ones(batch, max_length, dtype=torch.long, device=device)} for _ in range(2)]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if how == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()  # as train_model's step
        with amp:
            loss = info_nce(*(encoder(dict(side))["sentence_embedding"] for side in sides), temperature=0.05)
        loss.backward()
        optimizer.step()

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):  # compiling, choosing kernels, recording graphs
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--models", help="comma-separated, from " + ", ".join(MODELS))
    p.add_argument("--batches", help="comma-separated batch sizes (default 64,512 on a GPU, 64 on a CPU)")
    p.add_argument("--steps", type=int, help="timed steps per side and round (default 20 on a GPU, 3 on a CPU)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mini-batch-size", type=int, default=64, help="GradCache mini-batch of batches above it")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--profile", action="store_true", help="also split each embforge side's steps into waiting for "
                   "data, forward, backward, optimizer, other (and the batches prepared ahead); on CUDA the "
                   "GPU-busy share")
    p.add_argument("--compile", action="store_true", help="also time embforge with `train.compile`")
    p.add_argument("--cuda-graphs", action="store_true", help="also time embforge with `train.compile: cuda_graphs`")
    p.add_argument("--ceiling", action="store_true", help="also time the bare step on full-length batches of random "
                   "tokens (" + ", ".join(CEILINGS) + "; the last on CUDA): what the GPU does without the loop")
    args = p.parse_args()
    device = pick_device(args.device)
    gpu = device.startswith("cuda")
    models = (args.models or ("bert-base" if gpu else "minilm,random-small")).split(",")
    batches = [int(b) for b in (args.batches or ("64,512" if gpu else "64")).split(",")]
    steps = args.steps or (20 if gpu else 3)
    work = Path(tempfile.mkdtemp(prefix="embforge-gpu-bench-"))
    store = ArtifactStore(work / "store")
    peak = peak_flops(device)

    results = []
    for name in models:
        model = model_folder(name, work)
        params = sum(p.numel() for p in sentence_model(model, args.max_length).parameters())
        for batch in batches:
            n = (WARMUP + steps) * batch
            rows = demo_rows("crops", n, store)
            tokens_per_pair = statistics.mean(tokens_per_row(rows, args.max_length))
            cfg = TrainConfig(batch_size=batch, lr=2e-5 if MODELS[name] is None else 1e-3,
                              max_length=args.max_length, checkpoint_every=10**9, temperature=0.05, device=device,
                              precision="auto", mini_batch_size=args.mini_batch_size if batch > args.mini_batch_size
                              else None)
            sides = {"embforge": {"padding_free": False}, "padding_free": {"padding_free": True},
                     **({"compiled": {"compile": True, "padding_free": False},
                         "compiled_padding_free": {"compile": True, "padding_free": True}} if args.compile else {}),
                     **({"cuda_graphs": {"compile": "cuda_graphs", "padding_free": False}} if args.cuda_graphs else {}),
                     "st_trainer": None}
            # Untimed, over every batch: a GPU's first run pays for set-up, and every sequence length's first
            # batch for choosing its kernels (measured on an H200: a side's first run went at a quarter of the speed).
            for settings in sides.values():
                measure(settings, model, rows, cfg, WARMUP + steps, work)
            measured = alternating(lambda side: measure(sides[side], model, rows, cfg, WARMUP + steps, work),
                                   sides, args.rounds)  # (rate, memory) of each round
            rates = {side: [rate for rate, _ in got] for side, got in measured.items()}
            memory = {side: [mem for _, mem in got] for side, got in measured.items()}
            st = statistics.median(rates["st_trainer"])
            result = {"model": name, "parameters": params, "batch": batch, "mini_batch_size": cfg.mini_batch_size}
            for side in sides:
                rate = statistics.median(rates[side])
                result[side] = {"pairs_per_s": round(rate, 2), "over_st": round(rate / st, 3),
                                "rounds": [round(r, 2) for r in rates[side]],
                                "tokens_per_s": round(rate * tokens_per_pair),
                                "mfu": mfu(params, rate * tokens_per_pair, peak),
                                "peak_memory_gb": round(max(memory[side]), 2) if gpu else None}
            if args.profile:
                result["profile"] = {side: profile_split(model, rows, cfg.model_copy(update=sides[side]), steps,
                                                         work, batch / result[side]["pairs_per_s"])
                                     for side in sides if sides[side] is not None}
            if args.ceiling:
                result["ceiling"] = {}
                for how in CEILINGS[: None if gpu else -1]:
                    seconds = ceiling(model, batch, args.max_length, device, how, steps)
                    tokens = 2 * batch * args.max_length / seconds
                    result["ceiling"][how] = {"step_s": round(seconds, 4), "tokens_per_s": round(tokens),
                                              "mfu": mfu(params, tokens, peak)}
            results.append(result)
            print(json.dumps(result), flush=True)

    table = Table(title=f"crops training, length {args.max_length}, {device}"
                        f"{' (' + torch.cuda.get_device_name(device) + ')' if gpu else ''}, {steps} timed steps x "
                        f"{args.rounds} rounds per side")
    for col in ("model", "batch", "side", "pairs/s", "vs Trainer", "tokens/s", "MFU", "peak GB"):
        table.add_column(col, justify="left" if col in ("model", "side") else "right")
    for r in results:
        batch = f"{r['batch']}" + (f" ({r['mini_batch_size']})" if r["mini_batch_size"] else "")
        for side in (k for k, v in r.items() if isinstance(v, dict) and "pairs_per_s" in v):
            f = r[side]
            table.add_row(r["model"], batch, side, f"{f['pairs_per_s']}", f"{f['over_st']}", f"{f['tokens_per_s']:,}",
                          "" if f["mfu"] is None else f"{f['mfu']:.1%}",
                          "" if f["peak_memory_gb"] is None else f"{f['peak_memory_gb']}")
    Console().print(table)
    for r in results:
        for side, prof in r.get("profile", {}).items():
            total = sum(prof["step_split_s"].values())
            print(f"step split, {r['model']} batch {r['batch']} {side}: {total:.4f} s/step = " + ", ".join(
                f"{part} {s:.4f} s ({s / total:.1%})" for part, s in prof["step_split_s"].items())
                + f"; prepared ahead {prof['prepared_ahead_s']:.4f} s/batch"
                + ("" if prof["gpu_busy"] is None else f"; GPU busy {prof['gpu_busy']:.1%} of an unprofiled step"))
    for r in results:
        for how, c in r.get("ceiling", {}).items():
            print(f"ceiling, {r['model']} batch {r['batch']} x {args.max_length} tokens, {how}: {c['step_s']:.4f} "
                  f"s/step, {c['tokens_per_s']:,} tokens/s" + ("" if c["mfu"] is None else f", MFU {c['mfu']:.1%}"))
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"device": device, "gpu": torch.cuda.get_device_name(device) if gpu else None,
                      "precision": "auto", "max_length": args.max_length, "steps": steps, "rounds": args.rounds,
                      "torch_threads": torch.get_num_threads(), "results": results}))


if __name__ == "__main__":
    main()
