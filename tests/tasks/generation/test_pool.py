"""tasks/generation/pool.py: a run killed mid-way keeps the pool shards it finished, and a rerun generates only
what they lack."""

import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from storage.store import ArtifactStore
from tasks.config.queries import QueriesConfig, query_sampling
from tasks.generation.pool import STATUSES
from tasks.queries import QUERIES, QueriesInputs, first_line, pool_key
from tests import processes
from tests.helpers import REPO, demo_documents
from tests.tasks.test_queries import COLUMNS

KILLABLE = """
import sys
from storage.store import ArtifactStore
from tasks.config.queries import QueriesConfig
from tasks.queries import QUERIES, QueriesInputs
from storage.base import ArtifactRef
store = ArtifactStore(sys.argv[1])
job = QueriesConfig.model_validate_json(sys.argv[2])
QUERIES.run(store, job, QueriesInputs(documents=ArtifactRef("ingest", sys.argv[3])))
"""


@pytest.mark.slow  # the LLM (transformers) in a subprocess killed mid-run, then again
def test_a_killed_run_keeps_its_finished_shards_and_a_rerun_makes_only_the_missing_ones(tmp_path, llm_dir):
    """Through the queries stage, the cheaper of the pool's two callers: a document's shard is one prompt's two
    samples, where the summaries' is three prompts'; both stages generate and read back by `pooled_rows`. What
    only summaries do, ask several prompts per document, is test_summarize.py's (fast)."""
    store = ArtifactStore(tmp_path / "store")
    docs = demo_documents(store, 6)
    job = QueriesConfig(llm=llm_dir, backend="transformers", shard_size=1,
                        sampling=query_sampling().model_copy(update=dict(n=2, max_tokens=12)))
    pool = store.pool("queries", pool_key(job))
    child = processes.Popen([sys.executable, "-c", KILLABLE, str(store.root), job.model_dump_json(), docs.key],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while len(pool.shards()) < 2 and child.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    finished = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in pool.shards()}
    assert 2 <= len(finished) < 6, "the run should have been killed between shards"
    before = sum(pq.read_metadata(p).num_rows for p in finished)
    assert before == 2 * len(finished)  # whole shards: each one document's two samples
    assert not store.exists(QUERIES.ref(job, QueriesInputs(documents=docs)))  # no half artifact

    ref = QUERIES.run(store, job, QueriesInputs(documents=docs))
    extra = store.manifest(ref)["extra"]
    assert extra["generated"] == 6 * 2 - before and extra["reused"] == before
    assert all((p.stat().st_mtime_ns, p.read_bytes()) == finished[p] for p in finished)  # never rewritten
    assert len(pool.shards()) == 6  # one new shard per missing document
    # The artifact reads the kept rows and the new ones alike.
    table = store.read_table(ref, "queries").to_pandas()
    assert list(table.columns) == COLUMNS and len(table) == 6 * 2 and set(table["backend"]) == {"transformers"}
    assert set(table["status"]) <= set(STATUSES) and (table["status"] == "ok").any(), table[["status", "continuation"]]
    assert [first_line(c)[0] for c in table["continuation"]] == table["query"].tolist()
