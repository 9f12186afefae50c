"""A contrastive training loop over (anchor, positive) pairs that survives being killed.

Why our own loop rather than SentenceTransformerTrainer: the schedule (warm-up over 10% of ONE
epoch, then linear decay over all epochs), bit-exact resume from a checkpoint (model, optimiser,
schedule and RNG state), and a per-step log that becomes the learning curve. The model, its
tokenisation (padding per batch) and its saved format are sentence-transformers'. Like the
paper's reference code it uses plain Adam without gradient clipping.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from tasks.config import TrainConfig
from tasks.methods.infonce import info_nce

Pair = tuple[str, str]


@dataclass
class StepLog:
    step: int
    epoch: int
    loss: float
    lr: float


def encode(model: SentenceTransformer, texts: list[str]) -> torch.Tensor:
    """Sentence embeddings with gradients; padding is to the longest text of this batch."""
    features = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v
                for k, v in model.preprocess(texts).items()}
    return model(features)["sentence_embedding"]


def make_batches(pairs_per_epoch: list[list[Pair]], batch_size: int) -> list[tuple[int, list[Pair]]]:
    """(epoch, batch) in training order; a trailing batch of one pair has no negatives: dropped."""
    batches = []
    for epoch, pairs in enumerate(pairs_per_epoch):
        for i in range(0, len(pairs), batch_size):
            if len(pairs[i : i + batch_size]) >= 2:
                batches.append((epoch, pairs[i : i + batch_size]))
    return batches


class Checkpoints:
    """The latest resumable state of one training run, saved atomically in `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / "checkpoint.pt"

    def save(self, state: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".checkpoint.{os.getpid()}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.path)  # a kill mid-save leaves the previous checkpoint intact

    def load(self) -> dict | None:
        return torch.load(self.path, weights_only=False) if self.path.is_file() else None


def train_contrastive(model: SentenceTransformer, pairs_per_epoch: list[list[Pair]], cfg: TrainConfig,
                      checkpoints: Checkpoints, log: logging.Logger | None = None,
                      on_step: Callable[[StepLog], None] | None = None) -> list[StepLog]:
    """Train `model` in place with InfoNCE; resume from `checkpoints` if a state is there."""
    log = log or logging.getLogger("embforge.train")
    batches = make_batches(pairs_per_epoch, cfg.batch_size)
    steps_per_epoch = len(batches) // len(pairs_per_epoch)
    warmup = max(1, round(cfg.warmup_ratio * steps_per_epoch))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    schedule = get_linear_schedule_with_warmup(optimizer, warmup, len(batches))
    torch.manual_seed(cfg.seed)
    history: list[StepLog] = []

    state = checkpoints.load()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["rng"])
        if torch.cuda.is_available() and state["cuda_rng"] is not None:  # None: saved on a CPU machine
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        history = [StepLog(**h) for h in state["history"]]
        log.info("train: resuming from checkpoint at step %d of %d", len(history), len(batches))

    model.train()  # dropout on: it is what makes the two views of the dropout method differ
    bar = tqdm(total=len(batches), initial=len(history), desc="train", unit="batch", mininterval=5)
    for step in range(len(history), len(batches)):
        epoch, batch = batches[step]
        # Anchors and positives go through the model separately (as sentence-transformers does):
        # one pass over 2x the rows was 25% slower on CPU, all of it in page faults.
        anchors, positives = (encode(model, [pair[i] for pair in batch]) for i in (0, 1))
        loss = info_nce(anchors, positives, cfg.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        entry = StepLog(step + 1, epoch, loss.item(), schedule.get_last_lr()[0])
        schedule.step()
        history.append(entry)
        bar.update(1)
        bar.set_postfix(loss=f"{entry.loss:.3f}")
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < len(batches):
            checkpoints.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                              "schedule": schedule.state_dict(), "rng": torch.get_rng_state(),
                              "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                              "history": [vars(h) for h in history]})
        if on_step:
            on_step(entry)
    bar.close()
    return history
