"""3 training steps of one recipe on a global batch of 16: in one process (the tests), or run by
torchrun in several, each on its shard (`torchrun ... distributed_steps.py INIT MLM PAIRS OUT [compiled]`; MLM: INIT
with a masked-LM head, SPLADE's base)."""

import sys
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from tasks.config.family_settings import MultiVectorSettings, SparseSettings
from tasks.config.recipes import RECIPES as REGISTRY
from tasks.config.training import LoraSettings, TrainConfig
from tasks.encoders import families
from tasks.encoders.lora import attach_lora
from tasks.encoders.models import sentence_model
from tasks.methods import distributed
from tasks.methods.batches import PairBatches
from tasks.methods.distributed import no_gather
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model

RECIPES = ("crops", "simcse", "semcse", "gpl")
# fp32: the processes' sums agree to 2e-7 in it (`auto` is bf16 on a CPU with native bf16, where they do not)
CFG = TrainConfig(batch_size=16, lr=1e-3, max_length=32, checkpoint_every=1000, precision="fp32")
# Each family other than dense, by name: its settings (the tiny encoder is 32 wide: CSR's 128 codes, 8 active; SPLADE's
# regularisers weighing in, a batch's mean term weights squared: not a mean over rows, so it is gathered or it differs).
FAMILIES = {"multi_vector": MultiVectorSettings(dim=16), "multi_vector_expanded": MultiVectorSettings(
    dim=16, query_expansion=12), "csr": SparseSettings(active_dims=8, aux_dims=16),
            "splade": SparseSettings(kind="splade", document_regularizer=1e-2, query_regularizer=1e-2)}
FAMILY_RECIPES = (("multi_vector", "crops"), ("multi_vector", "gpl"), ("multi_vector_expanded", "crops"),
                  ("csr", "crops"), ("csr", "gpl"), ("splade", "gpl"))
# These train on rows of 5 to 32 tokens in batches of 15, so each process holds other rows (8 and 7) and other widths,
# filled to the longest of both. SPLADE trains on the rows of 13 tokens in batches of 16: over ragged rows its
# gradients still agree to 5e-6 of each tensor's norm, but the max over 30,522 terms and Adam carry the rounding of
# the different padding to 4e-4 in a few embedding rows after 4 steps (as merging its columns in one process does).
RAGGED = {"multi_vector", "multi_vector_expanded", "csr"}


def with_negatives(pairs: str) -> str:
    """The pairs file with a hard negative per row, beside `pairs`: what GPL trains on."""
    return str(Path(pairs).with_name(f"{Path(pairs).stem}-negatives.parquet"))


def ragged(pairs: str) -> str:
    """The pairs file of RAGGED's families, beside `pairs`: 45 rows of 5 to 32 tokens."""
    return str(Path(pairs).with_name("ragged.parquet"))


def family_model(init_dir: str, mlm_dir: str, family: str):
    """The tiny encoder as a model of `family` (a name of FAMILIES), its head drawn from seed 0."""
    if family == "splade":
        return families.splade_model(mlm_dir, FAMILIES[family], CFG.max_length, "cpu", seed=0)
    build = families.multi_vector_model if family.startswith("multi_vector") else families.sparse_model
    return build(sentence_model(init_dir, CFG.max_length), FAMILIES[family], seed=0)


def three_steps(init_dir: str, pairs: str, recipe: str, gather: bool, scratch: Path, compile: bool = False,
                lora: bool = False, family: str | None = None, mlm_dir: str = "") -> dict:
    """The loss at each step (the global batch's), the weights after the last, and the graphs compiled (`compile`:
    `train.compile`'s encoder); `lora`: only a LoRA adapter trains (train.lora); `family`: a model of that family
    (FAMILIES'; SPLADE's from `mlm_dir`; RAGGED's on the ragged rows, 15 a batch)."""
    cfg = CFG.model_copy(update={"batch_size": 15}) if family in RAGGED else CFG
    pairs = ragged(pairs) if family in RAGGED else pairs
    pairs = with_negatives(pairs) if REGISTRY[recipe].hard_negatives else pairs
    torch.manual_seed(0)  # the same projection head (SimCSE's MLP) everywhere
    # Mean pooling for all: a 1-layer random encoder gives nearly the same CLS vector for every text,
    # and Adam turns the tiny gradients of such a batch into full steps of noise.
    model = (family_model(init_dir, mlm_dir, family) if family else
             sentence_model(init_dir, CFG.max_length, compile=compile))
    if lora:
        attach_lora(model, LoraSettings(r=4, dropout=0.0), seed=0)  # no masks: each process would draw its own
    objective = build_objective(model, recipe, cfg, None, None, None if gather else no_gather,
                                FAMILIES[family] if family else None)
    graphs = counters["stats"]["unique_graphs"]
    history = train_model(objective, PairBatches(pq.ParquetFile(pairs), cfg.batch_size), cfg, Checkpoints(scratch))
    if family and distributed.world()[0] == 0:  # as the health probe: process 0 alone encodes a model in training
        model.train()  # mode; a gather there would wait for the other process (the process group's timeout below)
        families.sentence_vectors(model, ["a probe of process 0 alone"], 4)
    return {"losses": [h.loss for h in history], "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "graphs": counters["stats"]["unique_graphs"] - graphs}


def main(init_dir: str, mlm_dir: str, pairs: str, out: str, compiled: str = "") -> None:
    """Every recipe with and without the gather, crops with a LoRA adapter, and each family's recipes with and without
    it; `compiled`: crops only, DistributedDataParallel around a compiled encoder (train.compile with devices > 1)."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # a collective one process missed: an error
    rank = dist.get_rank()
    scratch = Path(out).parent / f"scratch-{compiled}{rank}"
    results = ({"compiled": three_steps(init_dir, pairs, "crops", True, scratch, compile=True)} if compiled else
               {(recipe, gather): three_steps(init_dir, pairs, recipe, gather, scratch)
                for recipe in RECIPES for gather in (True, False)}
               | {"lora": three_steps(init_dir, pairs, "crops", True, scratch, lora=True)}
               | {(family, recipe, gather): three_steps(init_dir, pairs, recipe, gather, scratch, family=family,
                                                        mlm_dir=mlm_dir)
                  for family, recipe in FAMILY_RECIPES for gather in (True, False)})
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()
    assert distributed.world() == (0, 1)


if __name__ == "__main__":
    main(*sys.argv[1:])
