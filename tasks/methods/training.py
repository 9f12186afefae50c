"""The training loop every recipe shares, over (anchor, positive) rows; it survives being killed.

Why our own loop rather than SentenceTransformerTrainer: the schedule (warm-up over 10% of ONE
epoch, then linear decay over all epochs), bit-exact resume from a checkpoint (model, decoder,
optimiser, schedule and RNG state: dropout and masking both draw from torch's RNG), and a
per-step log that becomes the learning curve. The losses are sentence-transformers-style modules
(`loss(sentence_features, labels)`), the model, its tokenisation (padding per batch) and its
saved format are sentence-transformers'. Adam(W), and the gradients' norm clipped as the HF and ST
trainers do (`max_grad_norm`); every step is checked for collapse and divergence (tasks/methods/health.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import get_constant_schedule, get_linear_schedule_with_warmup

from storage import leases
from tasks.config.recipes import Pair
from tasks.config.training import TrainConfig
from tasks.core.prefetch import prefetched
from tasks.core.progress import StageProgress
from tasks.core.stopping import SIGNALS, StepBoundaryStop, stop_signal
from tasks.encoders import precision
from tasks.encoders.models import to_device
from tasks.methods import distributed, health
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import Objective


@dataclass
class StepLog:
    step: int
    epoch: int
    loss: float
    lr: float
    chance: float | None = None  # the loss of one vector for every text, for this step's rows (health.py)
    knn_accuracy: float | None = None  # the learning curve, every `eval_every` steps
    grad_norm: float | None = None  # before clipping
    probe_cosine: float | None = None  # the probe batch's mean cosine: after step 1, every health.PROBE_EVERY steps


class StepTimes:
    """Wall seconds per part of each training step (`benchmarks/train_step.py --profile`): waiting for
    the batch (read and padded ahead on a background thread, tasks/core/prefetch.py), forward,
    backward, the optimizer (with clipping), and the rest (logging, checkpoints); and apart, the
    seconds the background thread took to prepare each batch. On CUDA the device is synchronised at
    each mark, so a kernel counts in the part that launched it."""

    PARTS = ("data", "forward", "backward", "optimizer", "other")

    def __init__(self, device: str | torch.device = "cpu"):
        self.steps: list[dict[str, float]] = []
        self.prepared: list[float] = []  # appended by the background thread
        self._sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
        self._last = 0.0

    def begin(self) -> None:
        self._sync()
        self.steps.append(dict.fromkeys(self.PARTS, 0.0))
        self._last = time.perf_counter()

    def mark(self, part: str) -> None:
        self._sync()
        now = time.perf_counter()
        self.steps[-1][part] += now - self._last
        self._last = now


class Checkpoints:
    """The two latest resumable states of one training run, saved atomically in `folder`.

    Loading never runs code (`weights_only`: tensors, numbers, strings, lists and dicts only), so a
    writable store is no way to attack whoever resumes; a checkpoint that cannot be read (cut short
    by a full disk, or crafted) is set aside with a warning and the one before it is used.
    """

    def __init__(self, folder: Path, saved: Callable[[], None] | None = None):
        self.folder, self.saved = folder, saved  # `saved`: called after each save (copies them to an object store)
        self.path = folder / "checkpoint.pt"
        self.previous = folder / "checkpoint.previous.pt"

    def save(self, state: dict) -> None:
        leases.confirm()  # a holder that stalled past its lease must not write over its successor's checkpoints
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".checkpoint.{os.getpid()}.tmp"
        with open(tmp, "wb") as file:  # through Python's file: a full disk is an OSError (ENOSPC), not torch's bare one
            try:
                torch.save(state, file)
            except RuntimeError as e:
                # A stop (Ctrl-C, the SIGTERM of a cancel from the UI) handled while torch's writer was in the
                # file's write comes out as torch's RuntimeError: raise the stop itself, so a stop stays a stop.
                if stop := stop_signal(e):
                    raise stop from None
                raise
        if self.path.is_file():
            os.replace(self.path, self.previous)
        os.replace(tmp, self.path)  # a kill at any point leaves at least one complete checkpoint
        if self.saved:
            self.saved()

    def load(self, log: logging.Logger | logging.LoggerAdapter | None = None) -> dict | None:
        """The newest readable state, or None to start from step 0."""
        for path in (self.path, self.previous):
            if not path.is_file():
                continue
            try:
                return torch.load(path, weights_only=True)
            except Exception as e:  # truncated, not a checkpoint, or holding objects that would run code
                aside = path.with_name(f"{path.name}.unreadable")
                os.replace(path, aside)
                reason = (str(e).splitlines() or [""])[0][:200]
                (log or logging.getLogger("embforge.train")).warning(
                    "checkpoint %s cannot be read (%s: %s); set aside as %s, trying an earlier one",
                    path.name, type(e).__name__, reason, aside.name)
        return None


def eager() -> contextlib.AbstractContextManager:
    """A compiled encoder runs its plain code: measuring and probing (eval mode, other batch sizes) would
    otherwise compile graphs of their own, each taking as long as many steps."""
    return torch.compiler.set_stance("force_eager")


def warmup_steps(cfg: TrainConfig, batches: PairBatches) -> int:
    return max(1, round(cfg.warmup_ratio * batches.steps_per_epoch))


def health_of(batches: PairBatches, cfg: TrainConfig, history: list[StepLog]) -> dict:
    """The trained model's health (health.summary), judged as it was during training."""
    return health.summary(history, warmup_steps(cfg, batches))


def train_model(objective: Objective, batches: PairBatches, cfg: TrainConfig,
                checkpoints: Checkpoints, log: logging.Logger | None = None,
                on_step: Callable[[StepLog], None] | None = None,
                measure: Callable[[], float] | None = None,
                probe: Callable[[], float] | None = None, stop_signals: tuple[int, ...] = SIGNALS,
                profile: StepTimes | None = None, until: int | None = None) -> list[StepLog]:
    """Train the objective's model in place; resume from `checkpoints` if a state is there.

    `until`: stop after that step of the schedule, its state checkpointed (a rung of a search: a later call
    continues from it to a later step, and the weights are then those of one uninterrupted run).

    `measure` (e.g. kNN accuracy of the current model) is recorded every `cfg.eval_every` steps
    and after the last one; `probe` (the probe batch's mean cosine, tasks/methods/health.py) after
    the first step, every health.PROBE_EVERY steps and after the last. Both must leave the model in
    training mode and not draw from torch's RNG. A collapse or divergence raises health.TrainingUnhealthy, or with
    `cfg.on_unhealthy: warn` is logged once and training goes on.
    Under torchrun (tasks/methods/distributed.py) every process trains on its shard of each batch
    through DistributedDataParallel; process 0 measures and writes the checkpoints, which hold every
    process's RNG state. A signal of `stop_signals` stops training at the next step boundary, the
    others where they land (the last checkpoint stays).
    """
    log = log or logging.getLogger("embforge.train")
    rank, size = distributed.world()
    loss_fn = objective.loss
    warmup = warmup_steps(cfg, batches)
    # The loss module holds the model and any training-only parts (decoder, head, CT's 2nd copy).
    # Fused: one kernel over every parameter (4x faster than the per-tensor loop on a CPU; the ST Trainer's too).
    optimizer = torch.optim.AdamW([p for p in loss_fn.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, fused=True)
    schedule = (get_constant_schedule(optimizer) if cfg.schedule == "constant"
                else get_linear_schedule_with_warmup(optimizer, warmup, len(batches)))
    amp = precision.MixedPrecision(cfg.precision, next(loss_fn.parameters()).device)
    if rank == 0:  # `auto` depends on the machine: say what it resolved to
        log.info("forward pass and loss in %s (train.precision: %s)", precision.dtype_name(amp.dtype), cfg.precision)
    torch.manual_seed(cfg.seed + rank)  # each process its own dropout masks; process 0 draws one device's
    history: list[StepLog] = []
    warned: set[str] = set()

    state = checkpoints.load(log)
    if state is not None and len(state["rng"]) != size:
        log.warning("the checkpoint was saved by %d process(es), not %d: training starts over", len(state["rng"]), size)
        state = None
    if state is not None:
        loss_fn.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        amp.load_state_dict(state.get("scaler"))
        torch.set_rng_state(state["rng"][rank])
        if torch.cuda.is_available() and state["cuda_rng"] is not None:  # None: saved on a CPU machine
            torch.cuda.set_rng_state(state["cuda_rng"][rank])
        history = [StepLog(**h) for h in state["history"]]
        log.info("resuming from checkpoint at step %d of %d", len(history), len(batches))
    end = len(batches) if until is None else min(until, len(batches))  # the step this call stops after

    loss_fn.train()  # dropout on: it is what makes the two views of dropout, SimCSE and CT differ
    forward = distributed.data_parallel(loss_fn)
    progress = StageProgress(end, "steps", done=len(history)) if rank == 0 else None
    bar = tqdm(total=end, initial=len(history), desc=progress.label if progress else "train", unit="batch",
               mininterval=5, disable=rank != 0)
    def save() -> None:
        rng = distributed.from_every_process(torch.get_rng_state())
        cuda_rng = distributed.from_every_process(torch.cuda.get_rng_state()) if torch.cuda.is_available() else None
        if rank == 0:
            checkpoints.save({"model": loss_fn.state_dict(), "optimizer": optimizer.state_dict(),
                              "schedule": schedule.state_dict(), "scaler": amp.state_dict(),
                              "rng": rng, "cuda_rng": cuda_rng, "history": [vars(h) for h in history]})

    # One process: a Ctrl-C or SIGTERM (those of `stop_signals`) is taken between steps, after a
    # checkpoint of the last one. Under torchrun each process gets its own signals and stops where it
    # is (the last checkpoint stays).
    stopping = StepBoundaryStop(stop_signals) if size == 1 else None
    lap = profile.mark if profile else lambda part: None
    if profile:
        profile.begin()
    # The next batches are read and padded on a background thread while this one trains. Rows of texts (a
    # pairs file, not the tokens stage's) are tokenized there: the tokenizer is shared with `measure` and
    # `probe`, which therefore wait for it to be free.
    tokenizer_free = threading.Lock()
    device = next(loss_fn.parameters()).device

    def prepared(epoch: int, batch: list[Pair]) -> tuple[int, int, list[dict], torch.Tensor | None]:
        rows = distributed.shard(batch, rank, size)
        labels = to_device({"labels": objective.labels(rows)}, device)["labels"] if objective.labels else None
        with tokenizer_free:
            return epoch, len(batch), objective.collate(rows), labels

    inputs = prefetched(itertools.starmap(prepared, itertools.islice(batches.from_step(len(history)),
                                                                     max(0, end - len(history)))),
                        on_prepared=profile.prepared.append if profile else None)
    with stopping or contextlib.nullcontext(), contextlib.closing(inputs):
        for step, (epoch, rows, features, labels) in enumerate(inputs, start=len(history)):
            lap("data")
            optimizer.zero_grad(set_to_none=True)  # first: the forward pass's activations reuse the gradients' memory
            if objective.at_step:
                objective.at_step(step, len(batches))
            if cfg.compile == "cuda_graphs":  # its graphs replay into the same buffers: the last step's are free now
                torch.compiler.cudagraph_mark_step_begin()  # (imports what takes a second: only when it matters)
            with amp.autocast():
                loss = forward(features, labels)
            lap("forward")
            amp.backward(loss)
            lap("backward")
            norm = amp.step(optimizer, cfg.max_grad_norm)
            lap("optimizer")
            entry = StepLog(step + 1, epoch, distributed.mean_over_processes(loss), schedule.get_last_lr()[0],
                            chance=objective.chance(rows) if objective.chance else None, grad_norm=norm)
            schedule.step()
            history.append(entry)
            last = step + 1 == end
            if rank == 0 and measure and cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or last):
                with tokenizer_free, eager():
                    entry.knn_accuracy = measure()
            if rank == 0 and probe and (step == 0 or (step + 1) % health.PROBE_EVERY == 0 or last):
                with tokenizer_free, eager():
                    entry.probe_cosine = probe()
            # the probe is process 0's
            problem = health.check(history, warmup, health.first_probe(history), final=last) if rank == 0 else None
            stop = bool(problem and problem.fatal and cfg.on_unhealthy == "stop")
            if distributed.from_process_0(stop):  # every process stops together: a clean end under torchrun
                raise health.TrainingUnhealthy(health.advice(problem, cfg) if problem
                                               else "stopped with process 0, whose health check failed")
            if problem and problem.kind not in warned:
                warned.add(problem.kind)  # once per kind: a collapsed run stays collapsed
                said = health.advice(problem, cfg) if problem.fatal else problem.why
                log.warning("%s; going on%s", said, " (train.on_unhealthy: warn)" if problem.fatal else "")
            bar.update(1)
            bar.set_postfix(loss=f"{entry.loss:.3f}")
            if progress:
                progress.advance()
            due = (step + 1) % cfg.checkpoint_every == 0 and step + 1 < len(batches) or last and end < len(batches)
            if due:
                save()
            if on_step:
                on_step(entry)
            if stopping and stopping.requested:
                if step + 1 < len(batches):
                    if not due:
                        save()
                    log.info("stopped after step %d of %d, its checkpoint saved", step + 1, len(batches))
                stopping.now()
            if profile:
                profile.mark("other")
                profile.begin()
    bar.close()
    if progress:
        progress.close()
    return history
