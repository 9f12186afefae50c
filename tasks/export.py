"""Export: a model embforge trained, as a sentence-transformers folder with a model card written
from the store, optionally with ONNX and OpenVINO files, and pushed to the Hugging Face Hub.

The card is sentence-transformers' own (`SentenceTransformerModelCardData`, a multi-vector model's
`MultiVectorEncoderModelCardData`, a sparse one's `SparseEncoderModelCardData`, their templates, the Hub's
`model-index` metadata), filled from the catalog: the recipe and its hyper-parameters, the corpus it trained on
(name, documents, digest of its bytes), the start model, training time and hardware, and every score the store
holds for the model. A section of embforge's own follows with what the template has no place for: the spread of kNN
accuracy, MTEB task revisions, and each exported backend's measured STS-B change.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentence_transformers import (
    MultiVectorEncoderModelCardData,
    SentenceTransformerModelCardData,
    SparseEncoderModelCardData,
)
from sentence_transformers.base.evaluation import BaseEvaluator
from sentence_transformers.base.model_card import BaseModelCardData

from storage.base import ArtifactRef, DamagedArtifactError
from storage.catalog import FINAL_SCORE, Catalog
from storage.store import ArtifactStore
from tasks.config.base import InputError, OutsideFault
from tasks.config.data import DEMO_STSB
from tasks.config.training import TrainConfig
from tasks.core.eval_sets import read_pairs
from tasks.encoders import backends, encode, families
from tasks.encoders.inputs import prompted
from tasks.encoders.models import MERGED, model_path, trained_ref
from tasks.methods.health import HEALTH_METRICS
from tasks.metrics.sts import sts_spearman
from tasks.static import STATIC

log = logging.getLogger("embforge.export")

MODEL_STAGES = ("train", "init", MERGED)
# Each family's card (tasks/encoders/families.py's MODEL_CLASSES loads its folder).
CARDS: dict[str, type[BaseModelCardData]] = {"dense": SentenceTransformerModelCardData,
                                             "multi_vector": MultiVectorEncoderModelCardData,
                                             "sparse": SparseEncoderModelCardData}


@dataclass
class ExportedModel:
    """What the store knows of one model: where it came from and how it scored."""

    ref: ArtifactRef
    label: str
    recipe: str
    pooling: str
    train: dict  # the train stage's job (recipe, hyper-parameters, base model), {} for init
    manifest: dict
    corpus: dict  # name, documents, digest of the ingest artifact it trained on
    scores: list[dict]  # the metrics view's rows for it: latest per metric, split, subset
    sts: dict | None  # the STS pairs (path, split) its run evaluated on, else the demo's
    backend_sts: dict[str, float] = field(default_factory=dict)  # backend → STS-B Spearman


def find_model(catalog: Catalog, name: str) -> dict:
    """A registered model by its label (the latest with it), or a train/init artifact by address."""
    rows = catalog.query("SELECT label, method, artifact, external, pooling, run_id FROM models "
                         "WHERE label = ? OR artifact = ? ORDER BY registered_at DESC LIMIT 1", [name, name])
    if not rows and ArtifactRef.parse(name).stage in MODEL_STAGES and catalog.store.exists(ArtifactRef.parse(name)):
        return dict(label=name, method=None, artifact=name, external=None, pooling=None, run_id=None)
    if not rows:
        known = [r["label"] for r in catalog.query("SELECT DISTINCT label FROM models ORDER BY label")]
        raise InputError(f"model {name!r}: no registered model has that label and no train or init artifact that "
                         f"address; `embforge models` lists them: {known}")
    if rows[0]["artifact"] is None:
        raise InputError(f"model {name!r} is {rows[0]['external']!r}, a model embforge did not train: export it "
                         "from where it comes from")
    return rows[0]


def ancestor(store: ArtifactStore, ref: ArtifactRef, stage: str) -> ArtifactRef | None:
    """The nearest input artifact of `stage` upstream of `ref` (breadth first: the corpus a model
    trained on, before the one its stage-1 start trained on)."""
    queue, seen = [ref], set()
    while queue:
        current = queue.pop(0)
        for address in store.manifest(current).get("input_files", {}):
            parent = ArtifactRef.parse(address)
            if parent.stage == stage:
                return parent
            if parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return None


def latest_scores(catalog: Catalog, address: str, pooling: str) -> list[dict]:
    """Every score of the model (not the curves), the latest of each (metric, dataset, split, subset),
    with the model's own pooling."""
    return catalog.query(f"""
        SELECT m.metric, m.dataset, m.value, m.std, m.n, m.repeats, m.split, m.subset, m.task_type,
               m.main_score, m.revision, m.mteb_version, rs.stage
        FROM metrics m JOIN run_stages rs ON rs.key = m.key
        WHERE m.model = $model AND m.status = 'ok' AND m.value IS NOT NULL AND {FINAL_SCORE}
          AND (m.pooling IS NULL OR m.pooling = $pooling)
        QUALIFY row_number() OVER (PARTITION BY m.metric, m.dataset, m.split, m.subset
                                   ORDER BY rs.started_at DESC) = 1
        ORDER BY rs.stage, m.metric""", dict(model=address, pooling=pooling))


def describe(catalog: Catalog, name: str) -> ExportedModel:
    store = catalog.store
    found = find_model(catalog, name)
    ref = ArtifactRef.parse(found["artifact"])
    manifest = store.manifest(trained_ref(store, ref))  # how it trained: a merged model's adapter artifact
    train = manifest["config"] if manifest["stage"] == "train" else {}
    pooling = found["pooling"] or "mean"
    corpus = {}
    if docs := ancestor(store, ref, "ingest"):
        ingest = store.manifest(docs)
        corpus = dict(name=ingest["config"].get("name") or Path(ingest["config"].get("path") or "?").stem,
                      documents=ingest["rows"].get("documents"), digest=store.files_digest(docs),
                      artifact=docs.address)
    sts = None
    if found["run_id"]:
        config = catalog.query("SELECT config FROM runs WHERE run_id = ?", [found["run_id"]])[0]["config"]
        sts = (json.loads(config).get("evaluate") or {}).get("sts")
    if not (sts and Path(sts["path"]).is_file()):
        sts = dict(path=str(DEMO_STSB), split="test") if DEMO_STSB.is_file() else None
    return ExportedModel(ref, found["label"], found["method"] or train.get("recipe", ref.stage), pooling, train,
                         manifest, corpus, latest_scores(catalog, ref.address, pooling), sts)


class RecordedScores(BaseEvaluator):
    """Scores embforge measured and stored, handed to the card as an evaluator's results."""

    def __init__(self, name: str, description: str, primary_metric: str, metrics: dict[str, float],
                 config: dict[str, Any]):
        super().__init__()
        self.name, self._description, self.primary_metric = name, description, primary_metric
        self.metrics, self.config = metrics, config

    def __call__(self, model, output_path=None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        return self.metrics

    @property
    def description(self) -> str:
        return self._description

    def get_config_dict(self) -> dict[str, Any]:
        return self.config


def evaluators(model: ExportedModel) -> list[RecordedScores]:
    """One per dataset and kind of score: the corpus's own metrics, STS, and one per MTEB task."""
    found = []
    own = [s for s in model.scores if s["stage"] != "mteb" and s["metric"] not in HEALTH_METRICS]  # scores only
    for dataset in sorted({s["dataset"] for s in own}):
        rows = [s for s in own if s["dataset"] == dataset]
        headline = next((s["metric"] for s in rows if s["metric"] == "knn_accuracy"), rows[0]["metric"])
        found.append(RecordedScores(dataset, "embforge evaluation", headline,
                                    {s["metric"]: s["value"] for s in rows}, {}))
    for s in (s for s in model.scores if s["stage"] == "mteb"):
        found.append(RecordedScores(s["metric"], f"MTEB {s['task_type'] or ''}".strip(), s["main_score"],
                                    {s["main_score"]: s["value"]},
                                    dict(split=s["split"], subset=s["subset"], revision=s["revision"],
                                         mteb_version=s["mteb_version"], n=s["n"])))
    return found


def hyperparameters(train: dict) -> tuple[dict, dict]:
    """(all, those that differ from embforge's defaults) of the training config."""
    every = train.get("train", {})
    defaults = TrainConfig().model_dump(mode="json")
    return every, {k: v for k, v in every.items() if defaults.get(k) != v}


def card_data(model: ExportedModel, repo: str | None,
              kind: type[BaseModelCardData] = SentenceTransformerModelCardData) -> BaseModelCardData:
    """The card's facts, as `kind` (the model class's own card data) keeps them."""
    corpus = model.corpus
    every, changed = hyperparameters(model.train)
    data = kind(
        model_name=f"{model.label}: {model.recipe} on {corpus.get('name', 'a domain corpus')} (embforge)",
        model_id=repo, local_files_only=True, generate_widget_examples=False,
        train_datasets=[dict(name=corpus["name"], size=corpus["documents"], columns=["text"],
                             loss=dict(fullname=f"embforge recipe {model.recipe}",
                                       config_code=f"  ```json\n  {json.dumps(changed)}\n  ```"))]
        if corpus else [],
        tags=["sentence-transformers", "sentence-similarity", "feature-extraction", "embforge", model.recipe])
    data.all_hyperparameters, data.non_default_hyperparameters = every, changed
    base = model.train.get("base_model") or ""
    if base.count("/") == 1 and not Path(base).exists():  # a Hub id: the Hub links the model to it
        data.base_model = base
    return data


def start_model(store: ArtifactStore, manifest: dict) -> str:
    """What a model without a base model started from: a random model (its shape), a converted GGUF LLM, or a model
    trained before it (stage 1, or a chained recipe's earlier stage)."""
    start = next((ArtifactRef.parse(a) for a in manifest.get("input_files", {})
                  if a.startswith(("init/", "train/", f"{MERGED}/", "llm/"))), None)
    if start is None:
        return "unknown"
    if start.stage in ("train", MERGED):
        return f"the model trained before it, `{start.address}`"
    c = store.manifest(start)["config"]
    if start.stage == "llm":
        return f"{c['source']}, converted from its GGUF file, `{start.address}`"
    kind = "Llama decoder" if c.get("architecture") == "llama" else "BERT encoder"
    return (f"a random {kind} ({c['layers']} layers, hidden {c['hidden']}, {c['heads']} heads, seed {c['seed']}; "
            f"tokenizer of {c['tokenizer']}), `{start.address}`")


def provenance(store: ArtifactStore, model: ExportedModel) -> str:
    """The card's embforge section: what ST's template has no place for."""
    m, corpus, extra = model.manifest, model.corpus, model.manifest.get("extra", {})
    static = model.ref.stage == STATIC.name  # distilled, not trained
    lines = ["", "## Trained and scored by embforge", "",
             f"- **Recipe:** `{model.recipe}` (pooling: {model.pooling}); artifact `{model.ref.address}`"]
    if static:
        c = m["config"]
        lines.append(f"- **Static model:** distilled from `{extra['teacher']}` with model2vec ({extra['vocabulary']:,} "
                     f"tokens x {extra['dim']} dims; PCA {c['pca_dims']}, SIF {c['sif_coefficient']})"
                     + (f", then trained with tokenlearn on the teacher's vectors of {extra['sentences']:,} sentences "
                        "of the corpus" if c["tokenlearn"] else "")
                     + f"; {m['wall_s']:.0f} s, finished {m['created_at']}")
    else:
        lines.append(f"- **Start model:** {model.train.get('base_model') or start_model(store, m)}")
    if corpus:
        lines.append(f"- **Corpus:** {corpus['name']}, {corpus['documents']:,} documents, "
                     f"digest `{corpus['digest']}` (`{corpus['artifact']}`)")
    if not static:
        lines.append(f"- **Training:** {m['wall_s']:.0f} s on {extra.get('hardware', 'unrecorded hardware')}, "
                     f"{extra.get('steps', '?')} steps, final loss {extra.get('final_loss') or float('nan'):.4f}, "
                     f"finished {m['created_at']}")
    if model.scores:
        lines += ["", "| score | dataset | value | spread (sd) | n | split | revision |",
                  "|---|---|---|---|---|---|---|"]
        for s in model.scores:
            spread = f"±{s['std']:.4f} over {s['repeats']} splits" if s["std"] is not None else ""
            lines.append(f"| {s['metric']} | {s['dataset']} | {s['value']:.4f} | {spread} | {s['n'] or ''} | "
                         f"{s['split'] or ''} | {s['revision'] or ''} |")
    if model.backend_sts:
        torch_score = model.backend_sts["torch"]
        lines += ["", "Exported backends, Spearman on the STS-B pairs the run evaluated on (load with "
                  "`SentenceTransformer(path, backend=..., model_kwargs={'file_name': ...})`; OpenVINO computes in "
                  "bf16 on CPUs that have it unless `ov_config` sets `INFERENCE_PRECISION_HINT: f32`):", "",
                  "| backend | file | STS-B Spearman | change |", "|---|---|---|---|"]
        for name, score in model.backend_sts.items():
            lines.append(f"| {name} | {BACKEND_FILES.get(name, 'model.safetensors')} | {score:.4f} | "
                         f"{score - torch_score:+.4f} |")
    return "\n".join(lines) + "\n"


# Exported variants: (backend, quantized) by the name the card and the CLI use.
VARIANTS = {"onnx": ("onnx", False), "onnx-int8": ("onnx", True),
            "openvino": ("openvino", False), "openvino-int8": ("openvino", True)}
BACKEND_FILES = {name: (backends.QUANTIZED_FILES if q else backends.FILES)[b] for name, (b, q) in VARIANTS.items()}


def add_backends(folder: Path, variants: list[str]) -> None:
    """Write the variants' files into the model folder, where sentence-transformers looks for them."""
    with tempfile.TemporaryDirectory() as scratch:  # also holds the ONNX file OpenVINO converts
        for name in variants:
            backend, quantized = VARIANTS[name]
            made = backends.backend_file(str(folder), backend, Path(scratch), quantized)
            target = folder / BACKEND_FILES[name]
            target.parent.mkdir(parents=True, exist_ok=True)
            for part in made.parent.glob(made.stem + ".*"):  # OpenVINO's .xml and .bin, ONNX's external data
                shutil.copy2(part, target.parent / part.name)


def default_prompt(folder: Path) -> str:
    """The prompt the model folder's `encode` puts before texts (the document one it trained with), or ''."""
    config = folder / "config_sentence_transformers.json"
    saved = json.loads(config.read_text()) if config.is_file() else {}
    return (saved.get("prompts") or {}).get(saved.get("default_prompt_name") or "", "")


def sts_by_backend(folder: Path, pooling: str, sts: dict, variants: list[str]) -> dict[str, float]:
    """Spearman on the STS pairs (`path`, `split`) for torch and each variant, read as evaluation read them (after
    the document prompt)."""
    pairs, prompt = read_pairs(sts["path"], sts.get("split")), default_prompt(folder)
    scores = {}
    for name in ["torch", *variants]:
        backend, quantized = VARIANTS.get(name, ("torch", False))
        encoder = encode.PooledEncoder(str(folder), "cpu", pooling, "fp32", backend, quantized)
        a, b = (encoder.encode(prompted(pairs[c].tolist(), prompt))  # evaluation's defaults
                for c in ("sentence1", "sentence2"))
        scores[name] = sts_spearman(a, b, pairs["score"].to_numpy())
        log.info("STS Spearman with %s: %.4f", name, scores[name])
    return scores


def check_export_folder(to: Path, field: str, store: Path) -> None:
    """An export goes to a new or empty folder outside the `store` (its folders are the store's to write); `field`
    names where the user set it."""
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise InputError(f"{field} {to}: exists and is not an empty folder; export never overwrites")
    if to.resolve().is_relative_to(store.resolve()):
        raise InputError(f"{field} {to.resolve()}: inside the store {store}; export to a folder outside it")


def export_model(catalog: Catalog, name: str, to: Path, variants: list[str], repo: str | None = None,
                 notes: str = "") -> ExportedModel:
    """Write the model `name` (a label or an artifact address) into `to`, which must not hold anything and
    must be outside the store (its folders are the store's to write); `notes` (Markdown) end its card."""
    check_export_folder(to, "--to", catalog.store.root)
    to = to.resolve()  # `.` has no name or parent to build next to
    model = describe(catalog, name)
    catalog.store.check(model.ref)  # on an object store: brought into the working copy
    family = families.family_of(str(model_path(catalog.store, model.ref)))
    if family != "dense" and variants:
        raise InputError(f"{model.label}: a {family} model is exported for torch only, not {', '.join(variants)}")
    # What leaves the store is what was published: every file's SHA-256, not only its size (a same-size
    # corruption would ship with the original scores in the card).
    if found := catalog.store.problems(model.ref, digests=True):
        raise DamagedArtifactError(f"{model.ref.address}: {'; '.join(found)}; not exported. `embforge verify` "
                                   "sets it aside; the next run of its config rebuilds it")
    # Built next to `to` and renamed into place when complete: a failed export leaves nothing half there.
    work = to.parent / f".{to.name}.partial-{os.getpid()}"
    try:
        shutil.copytree(model_path(catalog.store, model.ref), work)
        (work / "README.md").unlink(missing_ok=True)  # else sentence-transformers keeps the card training saved
        add_backends(work, variants)
        if variants and model.sts:
            model.backend_sts = sts_by_backend(work, model.pooling, model.sts, variants)
        elif variants:
            log.warning("no STS pairs to score the backends on (the run had no evaluate.sts, and %s is not here)",
                        DEMO_STSB)
        st = families.MODEL_CLASSES[family](str(work), device="cpu",
                                            model_card_data=card_data(model, repo, CARDS[family]))
        for evaluator in evaluators(model):
            st.model_card_data.set_evaluation_metrics(evaluator, evaluator.metrics)
        if encode.is_static(str(work)):  # sentence-transformers would write its own weight names, which model2vec
            with tempfile.TemporaryDirectory() as card:  # cannot read: only the card is taken from it
                st.save(card)
                shutil.copyfile(Path(card) / "README.md", work / "README.md")
        else:
            st.save(str(work))  # writes the card (README.md) with the rest; the backend files stay
        with open(work / "README.md", "a") as card:
            card.write(provenance(catalog.store, model) + (f"\n{notes}" if notes else ""))
        if to.exists():  # empty, checked above, and perhaps the working directory: filled, not replaced
            for entry in work.iterdir():
                entry.rename(to / entry.name)
        else:
            work.rename(to)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return model


def push_to_hub(folder: Path, repo: str, private: bool = False) -> str:
    """Upload the exported folder as it is (card and backend files included) to a Hub model repo."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        return str(api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="embforge export"))
    except Exception as e:  # noqa: BLE001 (offline, refused, no token, a network error: one line)
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise OutsideFault(f"{folder} is written, but pushing it to the Hub repo {repo} failed ({type(e).__name__}: "
                           f"{why}); check the network and HF_TOKEN, then `hf upload {repo} {folder}`") from None
