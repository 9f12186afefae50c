"""Train: fine-tune an encoder with one recipe on a pairs artifact; save it in sentence-transformers format.

Inputs: `pairs` and their `tokens` (the rows trained on, as token ids: tasks/tokens.py), `start` (the
init or stage-1 artifact the encoder starts from, if any), `documents` when a learning curve is asked
for (`train.eval_every`), and `resume`: a rung, the train artifact of the same job stopped at an earlier step.
Only the encoder is saved: decoders, MLM heads and projection heads are training-only (a multi-vector model's
token projection, a CSR model's autoencoder and a SPLADE model's masked-LM head are part of it). Checkpoints go to
the store's scratch area, so a killed run resumes mid-training.
Output: `model/` (loads with `SentenceTransformer(path)`, a multi-vector model with `MultiVectorEncoder(path)`, a
sparse one with `SparseEncoder(path)`;
with `train.lora`, the adapter alone, which the merge stage adds into the start model: tasks/merge.py) and
`training.parquet` (the per-step loss, learning rate, gradient norm and probe cosine, and with `eval_every` the kNN
accuracy from step 0 on: the learning curve); the manifest's `health` is the model's health summary
(tasks/methods/health.py).
A rung (the job's `until`: a short run of a search over recipes) stops after that step of the full schedule and
also keeps its training state (`state.pt`: weights, optimiser, schedule, RNG, the steps so far), from which a later
train job (a later rung, or the whole budget) continues: no step is trained twice, and the weights are those of one
uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import transformers
from prefect.runtime import deployment
from pydantic import Field
from sentence_transformers.base.model import BaseModel

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from storage.stores import store_at
from tasks.config.base import InputError, Section
from tasks.config.family_settings import FamilySettings, MultiVectorSettings, SparseSettings
from tasks.config.model import Prompts
from tasks.config.splits import KnnConfig
from tasks.config.training import MethodConfig, TrainConfig, bidirectional_for, pooling_for
from tasks.core import stopping
from tasks.core.stage import Inputs, Stage
from tasks.encoders import families, lora, models, packed
from tasks.encoders.inputs import model_tokenizer_digest
from tasks.encoders.models import base_model_identity, model_path, pick_device, sentence_model
from tasks.methods import distributed, health, objectives, training
from tasks.methods.batches import PairBatches
from tasks.metrics import knn


class TrainJob(Section):
    base_model: str | None = Field(description="Pre-trained start (name or path); None when the "
                                   "inputs carry the encoder to start from (random init, stage 1).")
    recipe: str
    mask_ratio: float | None  # the encoder's masking ratio, for recipes that mask
    decoder_visible: float | None  # RetroMAE's decoder
    train: TrainConfig
    knn: KnnConfig | None = Field(None, description="Protocol of the learning curve (set with eval_every).")
    prompts: Prompts = Field(default_factory=Prompts, description="Saved with the model (its texts were tokenized "
                             "with them: tasks/tokens.py); the learning curve's documents are encoded with them.")
    until: int | None = Field(None, ge=1, description="Stop after this step of the schedule, keeping the training "
                              "state (a rung); None: train the whole schedule.")
    multi_vector: MultiVectorSettings | None = Field(None, description="Train the multi_vector family with these "
                                                     "settings; None: another family.")
    sparse: SparseSettings | None = Field(None, description="Train the sparse family with these settings; None: "
                                          "another family.")

    @property
    def family_settings(self) -> FamilySettings | None:
        """The settings of the family other than dense that the job trains, None for a dense model."""
        return self.multi_vector or self.sparse

    @classmethod
    def for_method(cls, base_model: str | None, method: MethodConfig, train: TrainConfig,
                   knn: KnnConfig | None, prompts: Prompts | None = None) -> TrainJob:
        return cls(base_model=base_model, recipe=method.recipe, mask_ratio=method.resolved_mask_ratio,
                   decoder_visible=method.resolved_decoder_visible, train=train, knn=knn if train.eval_every else None,
                   prompts=prompts or Prompts(),
                   **({method.family: method.family_settings} if method.family_settings else {}))


def boundary_signals() -> tuple[int, ...]:
    """The signals training takes at a step boundary. A deployment's run leaves SIGTERM to Prefect's
    own handler: its runner or worker cancels it with SIGTERM only after that handler has taken the
    cancellation (none other may be installed then), and only so is the run recorded Cancelled, not
    Crashed. That SIGTERM stops training where it lands; the rerun resumes from the last checkpoint."""
    return (signal.SIGINT,) if deployment.id else stopping.SIGNALS


def training_model(path: str, job: TrainJob, device: str) -> BaseModel:
    """The model at `path` as the job trains it: its family, pooling, layer, packing, compiling, attention, dropout
    and prompts (its `encode` reads texts as documents), with a LoRA adapter (`train.lora`) and gradient
    checkpointing where the config asks. A model of another family is not packed (the config refuses
    `padding_free: true` for it, and `auto` stays padded)."""
    cfg = job.train
    packing = False if job.family_settings else cfg.padding_free
    if job.sparse and job.sparse.kind == "splade":  # the masked-LM head's logits, not a pooled vector
        model = families.splade_model(path, job.sparse, cfg.max_length, device, cfg.seed, cfg.layer, cfg.dropout)
    else:
        model = sentence_model(path, cfg.max_length, device, pooling_for(job.recipe, cfg), cfg.layer, packing,
                               cfg.compile, bidirectional_for(job.recipe, cfg), cfg.dropout)
    if job.multi_vector:
        model = families.multi_vector_model(model, job.multi_vector, cfg.seed)
    if job.sparse and job.sparse.kind == "csr":
        model = families.sparse_model(model, job.sparse, cfg.seed)
    for name, value in job.prompts.sentence_transformers().items():
        setattr(model, name, value)
    if cfg.lora:
        lora.attach_lora(model, cfg.lora, cfg.seed)
    if cfg.gradient_checkpointing:
        models.checkpoint_activations(model)
    return model


def frozen_objective(model: BaseModel, job: TrainJob) -> objectives.Objective:
    """The recipe's loss around `model`, with the configured layers frozen."""
    cfg = job.train
    # Training-only parts (heads, decoders) start from the seed, not from whatever the process drew before.
    torch.manual_seed(cfg.seed)
    objective = objectives.build_objective(model, job.recipe, cfg, job.mask_ratio, job.decoder_visible,
                                           family=job.family_settings)
    # Freeze after building the loss: TSDAE's tied decoder replaces the encoder's parameters with
    # its own, and CT's second copy must be frozen too.
    for encoder in objective.loss.modules():
        if isinstance(encoder, BaseModel):
            models.freeze(encoder, cfg.freeze_embeddings, cfg.freeze_layers)
    return objective


def knn_curve(model: BaseModel, docs: pa.Table, cfg: KnnConfig, batch_size: int) -> Callable[[], float]:
    """kNN accuracy of the model as it is now (its own pooling, or a multi-vector model's mean token vector; the
    training max length)."""
    docs = docs.filter(pc.is_valid(docs["label"]))
    texts, labels = docs["text"].to_pylist(), docs["label"].to_pylist()
    if reason := knn.knn_skipped(labels, cfg.k):  # a curve of nothing, or of 1.000 at every step
        raise InputError(f"train.eval_every: {reason}: the learning curve needs at least {2 * cfg.k} labelled "
                         "documents of two labels or more")

    def measure() -> float:
        emb = families.sentence_vectors(model, texts, batch_size).cpu().numpy()  # eval mode: no RNG draws
        model.train()
        return knn.knn_accuracy(emb, labels, cfg.k, cfg.test_size, cfg.seed)[0]

    return measure


def probe_cosine(model: BaseModel, texts: list[str]) -> Callable[[], float]:
    """The mean cosine of the probe texts' embeddings by the model as it is now (health.py)."""
    def probe() -> float:
        cosine = health.probe_mean_cosine(lambda batch: families.sentence_vectors(model, batch, len(batch)), texts)
        model.train()  # encode left it in eval mode (no RNG draws)
        return cosine

    return probe


class TrainInputs(Inputs):
    pairs: ArtifactRef  # the probe's texts
    tokens: ArtifactRef  # the pairs as token ids: what trains
    start: ArtifactRef | None = None  # the init or stage-1 encoder; else job.base_model
    documents: ArtifactRef | None = None  # the learning curve's (with train.eval_every)
    resume: ArtifactRef | None = None  # a rung of the same job, stopped at an earlier step: training goes on from it


STATE = "state.pt"  # a rung's training state, in its artifact
START_ROWS = 1024  # the training texts (the first row group's) a CSR model's codes start from (start_codes)


def resumed_state(store: ArtifactStore, job: TrainJob, inputs: TrainInputs, checkpoints: training.Checkpoints) -> None:
    """A rung's state as this run's checkpoint, where this run has none of its own yet (a kill after its first
    checkpoint resumes from that). The rung must be this job stopped earlier: the same training, the same schedule."""
    rung = store.manifest(inputs.resume)
    same = {k: v for k, v in job.model_dump(mode="json").items() if k != "until"}
    roles = ("pairs", "tokens", "start")  # what it trained on, and from
    ours = {role: ref.key if (ref := getattr(inputs, role)) else None for role in roles}
    if ({k: v for k, v in rung["config"].items() if k != "until"} != same or rung["config"]["until"] is None
            or rung["config"]["until"] > (job.until or float("inf"))
            or {role: rung["input_roles"].get(role) for role in roles} != ours):
        raise InputError(f"{inputs.resume.address}: not a rung of this training (another job or other inputs, a "
                         "whole run, or a later step); a run continues only its own earlier rung")
    if distributed.world()[0] == 0 and not checkpoints.path.is_file():
        shutil.copyfile(store.path(inputs.resume) / STATE, checkpoints.path)
    distributed.from_process_0(True)  # under torchrun: the others load it once it is there


def compiled_as(compile: bool | str, device: torch.device) -> str:
    if compile == "cuda_graphs":
        return ", compiled with CUDA graphs" if device.type == "cuda" else ", compiled (CUDA graphs: CUDA only)"
    return ", compiled" if compile else ""


SHORT_ANCHORS = 0.1  # below this share of anchors shorter than its width, query expansion hardly trains


def expansion_trained(tokens: pq.ParquetFile, width: int, log: logging.Logger) -> None:
    """How many anchors `multi_vector.query_expansion` fills in training (those shorter than `width` tokens), with a
    warning where few are: its [MASK] vectors then hardly train, yet every shorter query the model is scored on is
    filled with them."""
    short = rows = 0
    for group in range(tokens.num_row_groups):  # a row group's anchors at a time
        lengths = pc.list_value_length(tokens.read_row_group(group, columns=["anchor"])["anchor"])
        short, rows = short + (pc.sum(pc.less(lengths, width)).as_py() or 0), rows + len(lengths)
    share = short / max(rows, 1)
    if share >= SHORT_ANCHORS:
        log.info("multi_vector.query_expansion: %.0f%% of the anchors are shorter than %d tokens and trained filled",
                 100 * share, width)
        return
    log.warning("multi_vector.query_expansion: %.1f%% of the anchors are shorter than %d tokens, the only ones it "
                "fills in training, so its [MASK] vectors hardly train, yet every shorter query the model is scored on "
                "is filled with them (crops on SciFact: -0.044 nDCG@10, docs/families.md): use it with short queries "
                "(inpars, gpl) or leave it off", 100 * share, width)


def fit(store: ArtifactStore, job: TrainJob, inputs: TrainInputs, ref: ArtifactRef, folder: Path,
        log: logging.Logger) -> tuple[list[dict], dict]:
    """Train, save the model in `folder/model`, and return the learning curve's rows and the model's
    health. Under torchrun every process runs this on its shard of each batch; process 0 saves."""
    cfg = job.train
    rank, size = distributed.world()
    model = training_model(model_path(store, inputs.start) if inputs.start else job.base_model, job,
                           distributed.process_device(pick_device(cfg.device)))
    if store.manifest(inputs.tokens)["extra"]["tokenizer"] != model_tokenizer_digest(model):
        raise InputError(f"{inputs.tokens.address}: its ids were made by another tokenizer or max length than the "
                         "one training loads (a Hub model updated since?): remove that artifact from the store and "
                         "run again")
    objective = frozen_objective(model, job)
    measure = (knn_curve(model, store.read_table(inputs.documents, "documents"), job.knn, cfg.batch_size)
               if inputs.documents and rank == 0 else None)
    with store.open_table(inputs.tokens, "tokens") as tokens:
        batches = PairBatches(tokens, cfg.batch_size, cfg.group_by_length, cfg.seed, cfg.max_steps,
                              cfg.min_batch_rows)
        log.info("%s recipe, %d rows x %d epoch(s), batch %d, lr %g, on %s%s; %s%s%s", job.recipe,
                 batches.epoch_rows[0], len(batches.epoch_rows), cfg.batch_size, cfg.lr, model.device,
                 f" and {size - 1} more process(es)" if size > 1 else "",
                 "padding-free" if packed.is_packed(model) else "padded",
                 ", grouped by length" if cfg.group_by_length else "", compiled_as(cfg.compile, model.device))
        if job.multi_vector and job.multi_vector.query_expansion:
            expansion_trained(tokens, job.multi_vector.query_expansion, log)
        # The curve's step 0: the model as it starts (checkpoints are loaded inside train_model, so
        # this is the starting model on a resume too).
        with training.eager():
            start = [vars(training.StepLog(0, 0, None, None, knn_accuracy=measure()))] if measure else []
        with store.open_table(inputs.pairs, "pairs") as pairs:
            first = pairs.read_row_group(0, columns=["anchor", "positive"])
        probe_texts = first["anchor"].to_pylist()[: health.PROBE_ROWS]
        if job.sparse and job.sparse.kind == "csr":  # a resumed run loads its own weights with its checkpoint
            texts = first["anchor"].to_pylist() + first["positive"].to_pylist()
            families.start_codes(model, texts[:START_ROWS], cfg.batch_size, cfg.seed)
        checkpoints = training.Checkpoints(store.scratch(ref), lambda: store.save_scratch(ref))
        if inputs.resume:
            resumed_state(store, job, inputs, checkpoints)
        try:
            history = training.train_model(objective, batches, cfg, checkpoints, log, measure=measure,
                                           probe=probe_cosine(model, probe_texts) if rank == 0 else None,
                                           stop_signals=boundary_signals() if size == 1 else (), until=job.until)
        except health.TrainingUnhealthy as e:
            raise health.TrainingUnhealthy(f"{job.recipe} recipe: {e}") from None
    if rank == 0:
        lora.save_with_adapter(model.to(getattr(torch, cfg.save_dtype)), folder / "model")
        if objective.head is not None:  # for a SPLADE method that starts from this model
            families.save_head(objective.head, model.transformers_model.get_input_embeddings().weight, folder / "model")
        if job.until and len(history) < len(batches):  # a rung: its state, for the run that goes on from it
            shutil.copyfile(checkpoints.path, folder / STATE)
    return start + [vars(h) for h in history], training.health_of(batches, cfg, history)


UNHEALTHY = "unhealthy.txt"  # under torchrun: the health check's error, for the launcher to raise


def launch(store: ArtifactStore, job: TrainJob, inputs: TrainInputs, ref: ArtifactRef, folder: Path, work: Path,
           processes: int, log: logging.Logger) -> tuple[list[dict], dict]:
    """`fit` in `processes` processes started by torchrun (this module's `__main__`); the learning
    curve and the health come back through `work`."""
    spec = work / "train.pickle"
    spec.write_bytes(pickle.dumps((store.url, job, inputs, ref, folder, work)))
    (work / UNHEALTHY).unlink(missing_ok=True)
    log.info("training in %d processes (torchrun, %s)", processes,
             "NCCL" if distributed.process_device(pick_device(job.train.device)).startswith("cuda") else "gloo")
    # The machine's threads shared out (torchrun's default is one per process).
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, torch.get_num_threads() // processes))}
    with subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", "-m", "tasks.train", str(spec)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as torchrun:
        for line in torchrun.stdout:  # text mode splits progress bars' \r updates into lines too
            if line.strip():
                log.info("%s", line.rstrip())
    if (work / UNHEALTHY).is_file():  # the health check stopped it: the one clear error, not retried
        raise health.TrainingUnhealthy((work / UNHEALTHY).read_text())
    if torchrun.returncode:
        raise RuntimeError(f"distributed training failed (torchrun exit code {torchrun.returncode}); see the "
                           "processes' output above")
    rows, model_health = json.loads((work / "curve.json").read_text())
    return rows, model_health


def build_model(store: ArtifactStore, job: TrainJob, inputs: TrainInputs,
                out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    processes = distributed.processes(job.train.devices, pick_device(job.train.device))
    if processes > job.train.batch_size:  # `auto` on more GPUs than a batch has rows (the config refuses a number)
        raise InputError(f"train.devices: auto is {processes} GPUs, but a batch of train.batch_size "
                         f"{job.train.batch_size} rows leaves some without a row: set devices to at most batch_size")
    rows, model_health = (launch(store, job, inputs, ref, out.folder, out.work, processes, log) if processes > 1
                          else fit(store, job, inputs, ref, out.folder, log))
    out.write_table("training", pa.Table.from_pylist(rows))
    steps = [r for r in rows if r["step"]]
    out.extra.update(steps=len(steps), final_loss=steps[-1]["loss"] if steps else None, health=model_health,
                     hardware=hardware(pick_device(job.train.device), processes))
    log.info("health: %s", health.verdict(health.findings(model_health)))


def hardware(device: str, processes: int) -> str:
    """What trained, for the model card: `1 x NVIDIA H100 80GB HBM3`, `2 x CPU (16 threads)`."""
    name = (torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda")
            else f"CPU ({torch.get_num_threads()} threads)")
    return f"{processes} x {name}"


TRAIN = Stage("train", build_model, extra_key=base_model_identity, gpu=True, seeds_global_rng=True)


def main(spec: str) -> None:
    """One torchrun process of `launch`: join the process group, then `fit`."""
    store_url, job, inputs, ref, folder, work = pickle.loads(Path(spec).read_bytes())
    distributed.die_with_parent()  # a killed launcher takes its processes along: no orphan writes checkpoints
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars, once per process
    device = distributed.process_device(pick_device(job.train.device))
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # NCCL's collectives run on the current device
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        log = logging.getLogger("embforge.train")
        logging.basicConfig(level=logging.INFO if dist.get_rank() == 0 else logging.WARNING,
                            format="%(message)s", force=True)  # the launcher logs each line through Prefect
        try:
            found = fit(store_at(store_url), job, inputs, ref, folder, log)
        except health.TrainingUnhealthy as e:  # every process stops at the same step, without a traceback
            if dist.get_rank() == 0:
                (work / UNHEALTHY).write_text(str(e))  # for the launcher to raise
            return
        if dist.get_rank() == 0:
            (work / "curve.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
