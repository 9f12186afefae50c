"""Decoder training at the paper config's size: tokens/s and peak memory of LLM2Vec's two stages with LoRA.

configs/paper/llm2vec.yaml trains a 1.3B decoder with LoRA, bf16 and gradient checkpointing at batch 64 x 256
tokens, and says that fits in 40 GB. This measures it, offline: a randomly initialised Llama of the chosen shape
(speed and memory do not depend on the weights' values; MiniLM's tokenizer, whose [SEP] ends the texts) trains
`mntp` and then `dropout` (the SimCSE stage) through embforge's own loop (tasks/methods/training.py) on demo
abstracts cut to --max-length tokens, each stage bidirectional with its adapter, as the pipeline trains them.
Reported per stage: tokens/s (real tokens of every column of a batch, over the timed steps), the peak device
memory (CUDA; none on a CPU), the step time, and the trainable share of the parameters.

Shapes: `sheared-llama-1.3b` (the paper config's; the default on a GPU), `qwen2.5-0.5b`, `smollm2-135m`, and
`tiny` (2 x 32: the tests' smoke run; the default on a CPU).

Usage: python benchmarks/train_decoder.py [--shape sheared-llama-1.3b] [--batch-size 64] [--max-length 256]
                                          [--steps 8] [--device auto] [--no-lora] [--no-checkpointing]
Prints a table, then ONE final line of JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from rich.console import Console
from rich.table import Table
from train_step import WARMUP, first_batches, write_tokens
from transformers import AutoTokenizer, LlamaConfig, LlamaModel

from tasks.config.base import DEFAULT_MODEL
from tasks.config.data import DEMO_DOCS
from tasks.config.training import LoraSettings, MethodConfig, TrainConfig
from tasks.encoders.models import load_model, pick_device
from tasks.methods.training import Checkpoints, train_model
from tasks.train import TrainJob, frozen_objective, training_model

# (hidden, layers, heads, key-value heads, intermediate) of each decoder family's model
SHAPES = {"sheared-llama-1.3b": (2048, 24, 16, 16, 5504), "qwen2.5-0.5b": (896, 24, 14, 2, 4864),
          "smollm2-135m": (576, 30, 9, 3, 1536), "tiny": (32, 2, 4, 4, 64)}
STAGES = ("mntp", "dropout")  # LLM2Vec's, as the llm2vec recipe chains them


def random_decoder(shape: str, folder: Path) -> None:
    hidden, layers, heads, kv_heads, intermediate = SHAPES[shape]
    tokenizer = load_model(DEFAULT_MODEL, AutoTokenizer.from_pretrained)
    LlamaModel(LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
                           max_position_embeddings=4096, tie_word_embeddings=True,
                           pad_token_id=tokenizer.pad_token_id)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def abstracts(n: int) -> pa.Table:
    """n demo abstracts as `same`-view rows (the text twice), the first epoch's."""
    texts = pq.read_table(DEMO_DOCS, columns=["text"])["text"].to_pylist()
    texts = (texts * -(-n // len(texts)))[:n]
    return pa.table({"anchor": texts, "positive": texts, "epoch": [0] * n})


def time_stage(recipe: str, folder: str, cfg: TrainConfig, rows: pa.Table, work: Path) -> dict:
    job = TrainJob.for_method(None, MethodConfig(name=recipe, recipe=recipe), cfg, None)
    model = training_model(folder, job, cfg.device)  # as the train stage builds it: adapter, checkpointing
    write_tokens(model, recipe, rows, work / f"tokens-{recipe}.parquet")
    objective = frozen_objective(model, job)
    columns = 1 if recipe == "mntp" else 2  # MNTP reads the anchors; SimCSE encodes both views
    stamps: list[float] = []
    cuda = torch.device(model.device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(model.device)
    with pq.ParquetFile(work / f"tokens-{recipe}.parquet") as tokens:
        lengths = [min(len(ids), cfg.max_length) for ids in tokens.read(columns=["anchor"])["anchor"].to_pylist()]
        train_model(objective, first_batches(tokens, cfg, None), cfg, Checkpoints(work / f"ckpt-{recipe}"),
                    on_step=lambda _: (torch.cuda.synchronize() if cuda else None, stamps.append(time.perf_counter())))
    timed = stamps[WARMUP:]
    seconds = timed[-1] - stamps[WARMUP - 1]
    real = sum(lengths[WARMUP * cfg.batch_size : len(stamps) * cfg.batch_size]) * columns
    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dict(tokens_per_s=real / seconds, step_s=seconds / len(timed),
                peak_memory_gib=torch.cuda.max_memory_allocated(model.device) / 2**30 if cuda else None,
                parameters=parameters, trainable_share=trainable / parameters)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=SHAPES, help="default: sheared-llama-1.3b on a GPU, tiny on a CPU")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--steps", type=int, default=8, help="timed steps per stage (after 1 warm-up step)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-lora", action="store_true", help="train every weight instead of LoRA adapters")
    p.add_argument("--no-checkpointing", action="store_true", help="keep activations (no gradient checkpointing)")
    args = p.parse_args()
    device = pick_device(args.device)
    shape = args.shape or ("sheared-llama-1.3b" if device.startswith("cuda") else "tiny")
    work = Path(tempfile.mkdtemp(prefix="embforge-decoder-"))
    random_decoder(shape, work / "decoder")
    rows = abstracts((WARMUP + args.steps) * args.batch_size)
    base = TrainConfig(batch_size=args.batch_size, max_length=args.max_length, lr=1e-4, device=device,
                       checkpoint_every=10**9, precision="auto", padding_free=False,
                       lora=None if args.no_lora else LoraSettings(), gradient_checkpointing=not args.no_checkpointing)
    measured = {recipe: time_stage(recipe, str(work / "decoder"), base.model_copy(
        update={"dropout": 0.3} if recipe == "dropout" else {}), rows, work) for recipe in STAGES}

    table = Table(title=f"{shape} ({measured['mntp']['parameters'] / 1e6:,.0f}M parameters) on {device}: batch "
                        f"{args.batch_size} x {args.max_length} tokens, "
                        f"{'full weights' if args.no_lora else 'LoRA'}, "
                        f"{'no checkpointing' if args.no_checkpointing else 'gradient checkpointing'}")
    for column in ("stage", "tokens/s", "s/step", "peak GiB", "trainable"):
        table.add_column(column)
    for recipe, m in measured.items():
        table.add_row(recipe, f"{m['tokens_per_s']:,.0f}", f"{m['step_s']:.3f}",
                      "-" if m["peak_memory_gib"] is None else f"{m['peak_memory_gib']:.1f}",
                      f"{m['trainable_share']:.2%}")
    Console(stderr=True).print(table)
    print(json.dumps(dict(shape=shape, device=device, gpu=torch.cuda.get_device_name() if device.startswith("cuda")
                          else None, batch_size=args.batch_size, max_length=args.max_length, lora=not args.no_lora,
                          checkpointing=not args.no_checkpointing, stages=measured)))


if __name__ == "__main__":
    main()
