"""The select flow (`embforge select`): the search over recipes on a tiny corpus, under the real Prefect engine."""

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sentence_transformers import SentenceTransformer

from flows.cli import main
from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.evaluation import YardstickConfig
from tasks.config.select import rung_steps
from tasks.core.held_out import held_out_documents, held_out_queries
from tasks.encoders import families
from tasks.methods.batches import plan_batches
from tests.helpers import DEMO_DOCS, tiny_config

# A quarter of 400 documents held out: ~100 titles, enough for a paired interval to tell crops from the untrained model
# (the titles, though the demo corpus has labels: the last run below lets `auto` take them)
YARDSTICK = {"kind": "titles", "held_out": 0.25, "seed": 0}
# 4 candidates, halved (eta 2) at 12 and 24 steps of a 48-step schedule; lr 30 collapses (docs/health.md)
SELECT = {"recipes": ["crops", "dropout"], "lrs": [3e-3, 30.0], "budget": 48, "eta": 2}


def select_config(tmp_path, run=None, yardstick=None, evaluate=None, limit=400, **select):
    return tiny_config(tmp_path, data={"limit": limit}, run=run or {},
                       evaluate={"knn": None, "sts": None, "tsne": False, "yardstick": yardstick or YARDSTICK,
                                 **(evaluate or {})},
                       select={**SELECT, "out": str(tmp_path / "chosen"), **select})


def run_select(config, **params):
    from flows.params import SelectParams
    from flows.select import select

    state = select(SelectParams(config=str(config), **params), return_state=True)
    return str(state.state_details.flow_run_id), state.result()


@pytest.mark.slow  # a search of 4 candidates through 3 rungs, all of it again from the cache, then by the labels
@pytest.mark.usefixtures("prefect_harness")
def test_select_climbs_the_rungs_from_checkpoints_decides_exports_and_reruns_from_the_cache(tmp_path):
    config = select_config(tmp_path)
    run_id, chosen = run_select(config)
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    decided = ArtifactRef("select", catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'select'",
                                                  [run_id])[0]["key"])
    ladder = store.read_table(decided, "ladder").to_pandas()
    first_rung, second_rung = rung_steps(48, 4, 2)
    assert (first_rung, second_rung) == (12, 24)
    first = ladder[ladder["steps"] == first_rung]
    assert len(first) == 4  # every candidate trains the first rung
    # The collapsing candidates are dropped with the health check's finding, never scored.
    collapsed = first[first["lr"] == 30.0]
    assert collapsed["score"].isna().all() and collapsed["dropped"].str.contains("collapsed").all()
    assert set(ladder[ladder["steps"] == second_rung]["candidate"]) == {"crops@0.003", "dropout@0.003"}
    winner = ladder[ladder["winner"]]["candidate"].iloc[0]
    assert ladder[ladder["steps"] == 48]["candidate"].tolist() == [winner]

    # Each rung went on from the one before: no step trained twice, and the last holds the whole schedule.
    trains = catalog.query("SELECT a.key FROM run_stages s JOIN artifacts a ON a.key = s.key WHERE s.run_id = ? "
                           "AND s.stage = 'train' AND s.state = 'Completed'", [run_id])
    rungs = {}
    for row in trains:
        manifest = store.manifest(ArtifactRef("train", row["key"]))
        cfg = manifest["config"]
        # one 48-step schedule for both views, over as many epochs as it takes: the pairs stage counted them
        pairs = store.manifest(ArtifactRef("pairs", manifest["input_roles"]["pairs"]))["extra"]
        per_epoch = len(plan_batches([pairs["documents"]], 16))
        assert cfg["train"]["max_steps"] == 48 and pairs["epochs"] == math.ceil(48 / per_epoch) > 1
        trained = store.read_table(ArtifactRef("train", row["key"]), "training").to_pandas()
        resumed = manifest["input_roles"].get("resume")
        rungs[row["key"]] = (cfg["recipe"], cfg["train"]["lr"], cfg["until"], resumed, trained["step"].max())
    for recipe, lr, until, resumed, last in rungs.values():
        assert last == (until or 48)
        if resumed:  # the rung before it, of the same candidate, stopped earlier
            before = rungs[resumed]
            assert before[:2] == (recipe, lr) and before[2] < (until or 48)
    optimiser_steps = sum(last - (rungs[resumed][4] if resumed else 0) for _, _, _, resumed, last in rungs.values()
                          if not np.isnan(last))
    cost = store.manifest(decided)["extra"]["cost"]
    # the collapsed ones' first rung, the runner-up's rungs to 24, the winner's to 48: each step once
    assert optimiser_steps == cost["trained_steps"] == 2 * 12 + 24 + 48
    assert cost["exhaustive_steps"] == 4 * 48

    # No candidate trained on a yardstick document.
    docs = store.read_table(ArtifactRef("ingest", catalog.query(
        "SELECT key FROM run_stages WHERE run_id = ? AND stage = 'ingest'", [run_id])[0]["key"]), "documents")
    held = held_out_documents(docs["doc_id"].to_pylist(), YardstickConfig(**YARDSTICK))
    for row in catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'pairs'", [run_id]):
        pairs = store.read_table(ArtifactRef("pairs", row["key"]), "pairs", ["doc_id"])
        assert not held & set(pairs["doc_id"].to_pylist())

    # The decision, and the model exported with it on its card.
    decision = store.manifest(decided)["extra"]["decision"]
    assert chosen["chosen"] == decision["chosen"] and chosen["said"] == decision["said"]
    base = decision["versus_base"]
    assert base["n"] >= 10 and base["low"] <= base["mean"] <= base["high"]
    assert decision["runner_up"] in {"crops@0.003", "dropout@0.003"} - {winner}
    section = (store.path(decided) / "selection.md").read_text()
    assert f"**Answer: {decision['chosen']}.**" in section and "Its known bias" in section
    assert (store.path(decided) / "ladder.png").stat().st_size > 0
    # crops beats the untrained model by ~0.15 nDCG@10 [+0.09, +0.21] here: the winner is the answer
    assert decision["chosen"] == winner == "crops@0.003" and base["significant"] and base["low"] > 0
    assert chosen["exported"] == str(tmp_path / "chosen")
    card = (tmp_path / "chosen" / "README.md").read_text()
    assert "which recipe" in card and decision["said"] in card and "training collapsed at step" in card
    model = catalog.query("SELECT artifact FROM models WHERE run_id = ? AND label = ?", [run_id, winner])
    exported = SentenceTransformer(str(tmp_path / "chosen"), device="cpu")
    stored = SentenceTransformer(str(store.path(ArtifactRef.parse(model[0]["artifact"])) / "model"), device="cpu")
    texts = ["a short text", "another one, longer than the first"]
    np.testing.assert_allclose(exported.encode(texts), stored.encode(texts), atol=1e-6)

    # A rerun (another export folder; a rung's stages through Prefect's thread pool) trains and scores nothing again,
    # and decides the same.
    again = select_config(tmp_path, run={"task_runner": "threads", "max_workers": 2}, out=str(tmp_path / "again"))
    rerun_id, rerun = run_select(again)
    states = Catalog(store).query("SELECT DISTINCT stage, state FROM run_stages WHERE run_id = ?", [rerun_id])
    assert {s["state"] for s in states} == {"Cached"}, states
    assert rerun["chosen"] == chosen["chosen"] and rerun["said"] == chosen["said"]

    # `auto` on a labelled corpus: the labels decide, on the same held-out documents, so the first rung (every
    # candidate's) is the same training, Cached.
    # Ranked among a sample of the corpus (every labelled held-out document and 60 others), as on a large corpus.
    labels = select_config(tmp_path, yardstick={"held_out": 0.25, "seed": 0}, out=str(tmp_path / "labelled"), sample=60)
    labelled_id, labelled = run_select(labels)
    catalog = Catalog(store)
    stages = catalog.query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [labelled_id])
    [sample] = [ArtifactRef("sample", r["key"]) for r in stages if r["stage"] == "sample"]
    sampled = store.manifest(sample)["extra"]
    # 60 drawn, and one of each label a query asks for that none of them has
    drawn = sampled["documents"] - sampled["needed"]
    assert sampled["of"] == 400 and 60 <= drawn <= 60 + len(set(docs["label"].to_pylist()))
    evaluated = [store.manifest(ArtifactRef("evaluate", r["key"]))["input_roles"]["documents"]
                 for r in stages if r["stage"] == "evaluate"]
    assert len(evaluated) >= 5 and set(evaluated) == {sample.key}  # the untrained model's and every rung's
    # filed apart from the corpus's own scores: a sample's ranks are never paired with the whole corpus's
    datasets = catalog.query("SELECT DISTINCT dataset FROM run_metrics WHERE run_id = ? AND metric LIKE 'label_%'",
                             [labelled_id])
    assert [r["dataset"].endswith(" (yardstick sample)") for r in datasets] == [True]
    assert not catalog.query("SELECT 1 FROM run_stages WHERE run_id = ? AND stage = 'sample'", [run_id])  # 400 < 5,000
    [yardstick] = [ArtifactRef("yardstick", r["key"]) for r in stages if r["stage"] == "yardstick"]
    assert store.manifest(yardstick)["extra"]["kind"] == "labels"
    first_keys = {key for key, rung in rungs.items() if rung[2] == first_rung}
    assert len(first_keys) == 4 and {(r["key"], r["state"]) for r in stages if r["key"] in first_keys} == {
        (key, "Cached") for key in first_keys}
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    section = (store.path(decided) / "selection.md").read_text()
    assert "Yardstick: label_ndcg_at_10, each labelled held-out document finding the documents of its label" in section
    assert "documents of one label near each other" in section  # its bias
    assert (f"It ranked among {sampled['documents']} of the 400 documents: the {sampled['needed']} its queries need "
            "and a sample of the others") in section
    assert labelled["chosen"] == store.manifest(decided)["extra"]["decision"]["chosen"]

    # Your own queries decide where given: here the held-out titles, each finding its own document, as a qrels file.
    # The same ranks as the titles yardstick: the same ladder, every training Cached. With kNN scored on the
    # documents too, the yardstick ranks among the whole corpus, however small `select.sample`.
    titled = docs.filter(pc.is_in(docs["doc_id"], pa.array(sorted(held)))).to_pandas()
    pd.DataFrame({"query_id": "q-" + titled["doc_id"], "query": titled["title"], "doc_id": titled["doc_id"],
                  "score": 1}).to_parquet(tmp_path / "qrels.parquet")
    qrels_id, by_qrels = run_select(select_config(tmp_path, yardstick={**YARDSTICK, "kind": "auto",
                                                                       "qrels": str(tmp_path / "qrels.parquet")},
                                                  out=str(tmp_path / "queried"), sample=60,
                                                  evaluate={"knn": {"repeats": 0}}))
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [qrels_id])
    assert {r["state"] for r in stages if r["stage"] == "train"} == {"Cached"} and "sample" not in {
        r["stage"] for r in stages}
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    assert "Yardstick: qrels_ndcg_at_10, each of your queries" in (store.path(decided) / "selection.md").read_text()
    queried = store.read_table(decided, "ladder").to_pandas()
    assert queried["score"].tolist() == pytest.approx(ladder["score"].tolist(), nan_ok=True)
    assert by_qrels["chosen"] == chosen["chosen"]

    # A consensus over the same titles: the same held-out documents, so every training is Cached; each candidate is
    # judged by the others' rankings fused (never its own), and the search exports to its own folder.
    consensus_id, by_consensus = run_select(select_config(tmp_path, yardstick={**YARDSTICK, "kind": "consensus"},
                                                          out=str(tmp_path / "consensus")))
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [consensus_id])
    assert {r["state"] for r in stages if r["stage"] == "train"} == {"Cached"}
    fused, alone = sorted((store.manifest(ArtifactRef("yardstick", r["key"])) for r in stages
                           if r["stage"] == "yardstick"), key=lambda m: m["extra"]["kind"] != "consensus")
    assert fused["extra"]["source"] == "titles"
    # `confirm`: the pool ranks; the winner is set against the untrained model on a label-free kind of one model,
    # the titles here, on the same held-out documents (both evaluated on it among the whole corpus)
    assert alone["extra"]["kind"] == "titles" and alone["extra"]["held_out"] == fused["extra"]["held_out"]
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    section = (store.path(decided) / "selection.md").read_text()
    assert "Yardstick: consensus_ndcg_at_10" in section and "judged by the fusion of the others" in section
    assert "Against the untrained model: title_ndcg_at_10" in section and "no trained majority" in section
    decision = store.manifest(decided)["extra"]["decision"]
    assert decision["confirmed_by"] == "titles" and decision["said"].startswith("the pool ranked ")
    assert (decision["chosen"] != "base") == (decision["versus_base"]["low"] > 0)  # the titles' interval decides
    asked = store.read_table(ArtifactRef("yardstick", alone["key"]), "queries").to_pandas()
    assert set(asked["doc_id"]) <= held and decision["versus_base"]["n"] == (asked["status"] == "ok").sum() >= 10
    judged = store.read_table(decided, "ladder").to_pandas()
    assert judged["score"].notna().sum() == ladder["score"].notna().sum()
    assert judged["score"].dropna().between(0, 1).all()
    assert judged["score"].tolist() != pytest.approx(ladder["score"].tolist(), nan_ok=True)
    decision = store.manifest(decided)["extra"]["decision"]
    assert by_consensus["chosen"] == decision["chosen"] and by_consensus["artifact"] == decided.address
    if by_consensus["exported"]:  # two searches on one store: each exported the model it chose
        assert by_consensus["exported"] == str(tmp_path / "consensus")

    # The neighbours (by name; auto's for text alone where too few documents to group): each held-out document asks
    # by its own vector, judged like a consensus; the same held-out documents, so the first rung comes from the cache
    # (its ladder may take other candidates further).
    # Among a sample of the corpus that keeps what both the neighbours and the confirming titles ask (30 of each,
    # drawn apart).
    near_id, by_neighbours = run_select(select_config(
        tmp_path, yardstick={**YARDSTICK, "kind": "neighbours", "max_queries": 30}, out=str(tmp_path / "neighbours"),
        sample=60))
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [near_id])
    assert {(r["key"], r["state"]) for r in stages if r["key"] in first_keys} == {(k, "Cached") for k in first_keys}
    [sample] = [ArtifactRef("sample", r["key"]) for r in stages if r["stage"] == "sample"]
    kept = set(store.read_table(sample, "documents")["doc_id"].to_pylist())
    asking = [set(held_out_queries(store, ArtifactRef("yardstick", r["key"])).to_pandas()["doc_id"])
              for r in stages if r["stage"] == "yardstick"]
    assert len(asking) == 2 and asking[0] != asking[1] and asking[0] | asking[1] <= kept
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    assert "Yardstick: neighbours_ndcg_at_10, each held-out document, by its own vector" in (
        store.path(decided) / "selection.md").read_text()
    near = store.read_table(decided, "ladder").to_pandas()
    assert near["score"].notna().sum() == ladder["score"].notna().sum() and near["score"].dropna().between(0, 1).all()
    assert by_neighbours["chosen"] == store.manifest(decided)["extra"]["decision"]["chosen"]

    # The clusters: every document asks, each candidate judged by the others' k-means grouping, paired by document.
    # Among a sample (60 and what the confirming titles need: the clusters need none), as on a large corpus.
    clusters_id, by_clusters = run_select(select_config(tmp_path, yardstick={**YARDSTICK, "kind": "clusters"},
                                                        out=str(tmp_path / "clusters"), sample=60))
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [clusters_id])
    assert {(r["key"], r["state"]) for r in stages if r["key"] in first_keys} == {(k, "Cached") for k in first_keys}
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    section = (store.path(decided) / "selection.md").read_text()
    assert "Yardstick: clusters_purity_at_10, each document of the corpus, by its own vector" in section
    assert "Against the untrained model: title_ndcg_at_10" in section  # the consensus's confirmation, Cached
    assert {r["state"] for r in stages if r["stage"] == "yardstick" and r["key"] == alone["key"]} == {"Cached"}
    [sample] = [ArtifactRef("sample", r["key"]) for r in stages if r["stage"] == "sample"]
    kept = set(store.read_table(sample, "documents")["doc_id"].to_pylist())
    assert store.manifest(sample)["input_roles"]["confirm"] == alone["key"] and set(asked["doc_id"]) <= kept
    confirmed = store.manifest(decided)["input_roles"]
    assert {store.manifest(ArtifactRef("evaluate", k))["input_roles"]["documents"] for k in confirmed["confirmed"]
            .values()} == {sample.key}  # ranked among the sample, as the pool
    grouped = store.read_table(decided, "ladder").to_pandas()
    assert grouped["score"].notna().sum() == ladder["score"].notna().sum()
    assert grouped["score"].dropna().between(0, 1).all()
    assert by_clusters["chosen"] == store.manifest(decided)["extra"]["decision"]["chosen"]
    assert f"over {len(kept)} documents" in by_clusters["said"]  # every sampled document asks; the titles fewer

    # Another corpus (its first 300 documents) on the same store: the same candidates' labels (crops@0.003, ...),
    # other trained models. Each search exports its own winner, never the other's of the same label.
    other_id, other = run_select(select_config(tmp_path, limit=300, out=str(tmp_path / "other")))
    assert other["exported"] == str(tmp_path / "other"), other
    [own] = Catalog(store).query("SELECT artifact FROM models WHERE run_id = ? AND label = ?", [other_id,
                                                                                               other["chosen"]])
    assert own["artifact"] != model[0]["artifact"]
    from_other = SentenceTransformer(str(tmp_path / "other"), device="cpu").encode(texts)
    np.testing.assert_allclose(from_other, SentenceTransformer(str(store.path(ArtifactRef.parse(own["artifact"])) /
                                                                   "model"), device="cpu").encode(texts), atol=1e-6)
    assert not np.allclose(from_other, exported.encode(texts), atol=1e-4)


@pytest.mark.slow  # crops as a dense and as a multi-vector candidate: one rung and the winner's last leg; then one
@pytest.mark.usefixtures("prefect_harness")
def test_a_multi_vector_candidate_climbs_beside_a_dense_one_and_is_exported_as_what_it_is(tmp_path):
    """`select.families`: each recipe that trains a family is tried as it too, on the same schedule and yardstick
    (the titles, which MaxSim ranks for the multi-vector candidate; then your queries, then `auto`, which on this
    labelled corpus takes the labels: each held-out document's token vectors against the others'); the answer is
    exported as its family's model."""
    config = select_config(tmp_path, yardstick=YARDSTICK, recipes=["crops", "tsdae"],
                           lrs=[3e-3], budget=24, families=["dense", "multi_vector"], multi_vector={"dim": 16})
    run_id, chosen = run_select(config)
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    stages = catalog.query("SELECT stage, key FROM run_stages WHERE run_id = ?", [run_id])
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    yardstick = next(ArtifactRef("yardstick", r["key"]) for r in stages if r["stage"] == "yardstick")
    assert store.manifest(yardstick)["extra"]["kind"] == "titles"
    ladder = store.read_table(decided, "ladder").to_pandas()
    [rung] = rung_steps(24, 3, 2)[:1]
    first = ladder[ladder["steps"] == rung]
    # TSDAE trains no multi-vector model: three candidates, every one scored on the first rung
    assert dict(zip(first["candidate"], first["family"])) == {
        "crops@0.003": "dense", "tsdae@0.003": "dense", "crops-multi-vector@0.003": "multi_vector"}
    assert first["score"].notna().all() and first["score"].between(0, 1).all()
    trained = [store.manifest(ArtifactRef("train", r["key"]))["config"] for r in stages if r["stage"] == "train"]
    assert {bool(cfg["multi_vector"]) for cfg in trained} == {False, True}
    assert all(cfg["multi_vector"]["dim"] == 16 for cfg in trained if cfg["multi_vector"])  # select's settings
    # the multi-vector candidate's titles ranked by MaxSim over its kept token vectors
    mv = next(store.manifest(ArtifactRef("evaluate", r["key"])) for r in stages if r["stage"] == "evaluate"
              and store.manifest(ArtifactRef("evaluate", r["key"]))["extra"].get("serving", {}).get("family")
              == "multi_vector")
    assert mv["extra"]["serving"]["bytes_per_document"] > 16 * 4
    decision = store.manifest(decided)["extra"]["decision"]
    assert chosen["chosen"] == decision["chosen"]
    # MaxSim finds a title's words in its text where the tiny random encoder's one vector blurs them: the
    # multi-vector candidate beat the dense one by +0.19 [+0.10, +0.28] nDCG@10 on the 12-step rung, and the
    # untrained model by +0.34 [+0.25, +0.42] at 24 steps. It is exported as sentence-transformers'
    # MultiVectorEncoder, giving the token vectors the search scored.
    assert chosen["chosen"] == "crops-multi-vector@0.003" and decision["versus_base"]["low"] > 0
    assert families.family_of(chosen["exported"]) == "multi_vector"
    [model] = catalog.query("SELECT artifact FROM models WHERE run_id = ? AND label = ?", [run_id, chosen["chosen"]])
    texts = ["a short text", "another one, longer than the first"]
    exported = families.load_saved(chosen["exported"], "cpu").encode(texts)
    stored = families.load_saved(str(store.path(ArtifactRef.parse(model["artifact"])) / "model"), "cpu").encode(texts)
    for mine, theirs in zip(exported, stored, strict=True):
        assert mine.shape[-1] == 16
        np.testing.assert_allclose(mine, theirs, atol=1e-6)

    # Your queries rank a multi-vector candidate by MaxSim too: here the held-out titles as a qrels file, so the same
    # ranks as the titles' and the same ladder, every training Cached.
    docs = pd.read_parquet(DEMO_DOCS).head(400)
    held = held_out_documents(docs["doc_id"].tolist(), YardstickConfig(**YARDSTICK))
    titled = docs[docs["doc_id"].isin(held)]
    pd.DataFrame({"query_id": "q-" + titled["doc_id"], "query": titled["title"], "doc_id": titled["doc_id"],
                  "score": 1}).to_parquet(tmp_path / "qrels.parquet")
    queried_id, queried = run_select(config, qrels=str(tmp_path / "qrels.parquet"),
                                     overrides={"select.out": str(tmp_path / "queried")})
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [queried_id])
    assert {r["state"] for r in stages if r["stage"] == "train"} == {"Cached"}
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    assert store.manifest(next(ArtifactRef("yardstick", r["key"]) for r in stages if r["stage"] == "yardstick")
                          )["extra"]["kind"] == "qrels"
    by_qrels = store.read_table(decided, "ladder").to_pandas()
    assert by_qrels["score"].tolist() == pytest.approx(ladder["score"].tolist())
    assert queried["chosen"] == chosen["chosen"]
    # `auto` takes the labels, which rank the multi-vector candidate by MaxSim between documents: its documents'
    # token vectors kept, every candidate scored on the first rung, every training Cached (the same held-out share).
    labelled_id, _ = run_select(config, overrides={"evaluate.yardstick.kind": "auto",
                                                   "select.out": str(tmp_path / "labelled")})
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [labelled_id])
    assert {r["state"] for r in stages if r["stage"] == "train"} == {"Cached"}
    assert store.manifest(next(ArtifactRef("yardstick", r["key"]) for r in stages if r["stage"] == "yardstick")
                          )["extra"]["kind"] == "labels"
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    by_labels = store.read_table(decided, "ladder").to_pandas()
    first = by_labels[by_labels["steps"] == rung]
    assert set(first["candidate"]) == {"crops@0.003", "tsdae@0.003", "crops-multi-vector@0.003"}
    assert first["score"].between(0, 1).all()
    kept = {store.manifest(ArtifactRef("embed", r["key"]))["config"]["token_vectors"] for r in stages
            if r["stage"] == "embed"}
    assert kept == {True, False}  # the multi-vector candidate's documents, not the dense ones'


@pytest.mark.slow  # a search of one candidate, thrice; the offline LLM (converted once per session) writes 12 queries
@pytest.mark.usefixtures("prefect_harness")
def test_a_text_only_corpus_is_judged_by_its_documents_clusters_or_an_llm_s_queries(tmp_path, llm_dir):
    """No title, no label, no queries of the user's: `kind: clusters` has every document ask for its nearest others,
    judged by the others' grouping (no LLM with `confirm: false`; by default the winner is then set against the
    untrained model on queries the LLM writes for the held-out documents); `auto`, with one candidate and the
    untrained model (too few to judge each other), has the queries stage's LLM write queries for the held-out
    documents (here 4 of them, 3 each: `max_queries` 12), each asking for its own document. The training is the same
    for all."""
    docs = pd.read_parquet(DEMO_DOCS).head(120)[["doc_id", "text"]]
    docs.to_parquet(tmp_path / "plain.parquet")
    held_out = {"held_out": 0.25, "seed": 0, "max_queries": 12}

    def config(out="chosen", confirm=True, **kind):
        return tiny_config(tmp_path, data={"path": str(tmp_path / "plain.parquet"), "name": "plain", "limit": None},
                           evaluate={"knn": None, "sts": None, "tsne": False, "yardstick": {**held_out, **kind}},
                           queries={"llm": llm_dir, "backend": "transformers"},  # 4 documents: no vLLM start-up
                           static={"of": ["base"], "pca_dims": 16, "tokenlearn": False, "speed_documents": 16},
                           select={"recipes": ["crops"], "lrs": [3e-3], "budget": 12, "out": str(tmp_path / out),
                                   "confirm": confirm})

    # by name, the clusters judge even this small pool (with a warning); `--static`: the answer distilled too, judged
    # in the pool
    run_id, chosen = run_select(config(kind="clusters", confirm=False), static=True)
    store = ArtifactStore(tmp_path / "store")
    stages = Catalog(store).query("SELECT stage, key FROM run_stages WHERE run_id = ?", [run_id])
    assert "queries" not in {r["stage"] for r in stages}
    [yardstick] = [ArtifactRef("yardstick", r["key"]) for r in stages if r["stage"] == "yardstick"]
    held = held_out_documents(docs["doc_id"].tolist(), YardstickConfig(**held_out))
    assert store.manifest(yardstick)["extra"]["kind"] == "clusters"
    assert set(held_out_queries(store, yardstick).to_pandas()["doc_id"]) == held  # out of training, and asking
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    assert "Yardstick: clusters_purity_at_10" in (store.path(decided) / "selection.md").read_text()
    assert chosen["chosen"] in ("crops@0.003", "base")
    teacher = "crops@0.003" if chosen["exported"] else chosen["base"]
    assert chosen["static"] == str(tmp_path / "chosen-static") and (tmp_path / "chosen-static" / "README.md").exists()
    assert f"against {teacher}'s" in chosen["static_said"] and "documents/s on the CPU" in chosen["static_said"]
    assert chosen["static_said"] in (tmp_path / "chosen-static" / "README.md").read_text()

    # confirmed (the default): the LLM's queries set the clusters' winner against the untrained model
    run_id, confirmed = run_select(config("confirmed", kind="clusters"), static=True)
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [run_id])
    assert {r["state"] for r in stages if r["stage"] == "train" or r["key"] == yardstick.key} == {"Cached"}
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    decision = store.manifest(decided)["extra"]["decision"]
    alone = [store.manifest(ArtifactRef("yardstick", r["key"]))["extra"] for r in stages if r["stage"] == "yardstick"
             and r["key"] != yardstick.key]
    assert [a["kind"] for a in alone] == ["queries"] and decision["confirmed_by"] == "queries"
    assert decision["versus_base"]["n"] == alone[0]["queries"] and confirmed["said"] == decision["said"]
    assert "on an LLM's queries (each model judged by itself)" in confirmed["said"]
    # the static model beside its teacher as the decision was made: on the LLM's queries, not in the pool
    assert f"over {alone[0]['queries']} queries" in confirmed["static_said"]

    run_id, chosen = run_select(config("queried"))
    stages = Catalog(store).query("SELECT stage, key, state FROM run_stages WHERE run_id = ?", [run_id])
    assert {r["state"] for r in stages if r["stage"] == "train"} == {"Cached"}
    [yardstick] = [ArtifactRef("yardstick", r["key"]) for r in stages if r["stage"] == "yardstick"]
    [queries] = [ArtifactRef("queries", r["key"]) for r in stages if r["stage"] == "queries"]
    assert {r["state"] for r in stages if r["stage"] == "queries"} == {"Cached"}  # the confirmation's
    written = store.read_table(queries, "queries").to_pandas()
    assert set(written["doc_id"]) < held and written["doc_id"].nunique() == 4  # held-out ones only, enough to ask 12
    assert set(written["split"]) == {"held_out"}
    extra = store.manifest(yardstick)["extra"]
    assert extra["kind"] == "queries" and extra["queries"] == (written["status"] == "ok").sum() >= 2
    decided = next(ArtifactRef("select", r["key"]) for r in stages if r["stage"] == "select")
    assert "Yardstick: generated_ndcg_at_10, each query an LLM wrote" in (store.path(decided) / "selection.md"
                                                                        ).read_text()
    assert chosen["chosen"] in ("crops@0.003", "base")


@pytest.mark.slow  # a decoder's two chained stages and a crops candidate, through one rung and the winner's last leg
@pytest.mark.usefixtures("prefect_harness")
def test_a_chained_recipe_on_a_decoder_trains_its_earlier_stage_once_and_climbs_the_rungs_with_its_last(
        tmp_path, tiny_decoder_dir):
    """`llm2vec` as a candidate beside `crops` (a decoder base's defaults, none named), with LoRA: its MNTP stage
    trains once to the budget before the search; its SimCSE stage starts from that model and is what the rungs stop
    or go on with."""
    config = tiny_config(tmp_path, data={"limit": 120}, model={"name_or_path": tiny_decoder_dir, "random_init": None},
                         train={"max_length": 32, "batch_size": 8, "lora": {"r": 4}},
                         evaluate={"knn": None, "sts": None, "tsne": False, "yardstick": YARDSTICK},
                         select={"lrs": [3e-3], "budget": 8, "eta": 2, "out": str(tmp_path / "chosen")})
    run_id, chosen = run_select(config)
    store = ArtifactStore(tmp_path / "store")
    made = Catalog(store).query("SELECT DISTINCT stage, label, key FROM run_stages WHERE run_id = ? AND stage IN "
                                "('train', 'merge', 'select')", [run_id])
    trains = [(r["label"], store.manifest(ArtifactRef("train", r["key"]))) for r in made if r["stage"] == "train"]
    merges = {r["label"]: r["key"] for r in made if r["stage"] == "merge" and r["label"].endswith("-mntp")}
    [decided] = [ArtifactRef("select", r["key"]) for r in made if r["stage"] == "select"]
    [rung] = rung_steps(8, 2, 2)
    # the MNTP stage: one artifact, trained once to the whole budget, a bidirectional decoder
    [(mntp_key, mntp)] = [(m["key"], m) for label, m in trains if label == "llm2vec@0.003-mntp"]
    assert mntp["config"]["recipe"] == "mntp" and mntp["config"]["until"] is None
    assert store.read_table(ArtifactRef("train", mntp_key), "training")["step"].to_pylist()[-1] == 8
    assert json.loads((store.path(ArtifactRef("merge", merges["llm2vec@0.003-mntp"])) / "model" / "config.json"
                       ).read_text())["is_causal"] is False
    # the SimCSE stage's rungs start from it
    simcse = [m for label, m in trains if label == "llm2vec@0.003"]
    assert simcse and all(m["config"]["recipe"] == "dropout" for m in simcse)
    assert {m["input_roles"]["start"] for m in simcse} == {merges["llm2vec@0.003-mntp"]}
    assert rung in {m["config"]["until"] for m in simcse}
    ladder = store.read_table(decided, "ladder").to_pandas()
    assert set(ladder[ladder["steps"] == rung]["candidate"]) == {"llm2vec@0.003", "crops@0.003"}
    assert ladder["score"].notna().all()
    cost = store.manifest(decided)["extra"]["cost"]
    # the MNTP stage's 8, each candidate's first rung, the winner's last leg to the budget
    assert cost["earlier_steps"] == 8 and cost["trained_steps"] == 8 + rung + 8
    assert cost["exhaustive_steps"] == 8 + 2 * 8
    assert "8 of them a chained candidate's earlier stages" in " ".join(
        (store.path(decided) / "selection.md").read_text().split())
    if chosen["chosen"] == "llm2vec@0.003":  # shipped: the merged SimCSE stage, bidirectional as it trained
        saved = json.loads((tmp_path / "chosen" / "config.json").read_text())
        assert saved["is_causal"] is False and saved["attention_dropout"] == 0.3
    # a rerun is all from the cache, with the same decision
    again_id, again = run_select(config, overrides={"select.out": str(tmp_path / "again")})
    states = Catalog(store).query("SELECT DISTINCT state FROM run_stages WHERE run_id = ?", [again_id])
    assert again["chosen"] == chosen["chosen"] and {r["state"] for r in states} == {"Cached"}, states


def test_bad_budgets_and_recipes_are_one_clear_error_before_anything_runs(tmp_path, capsys):
    cases = {"budget": ({"budget": 2}, "select.budget: a budget of 2 steps is too small for 4 candidates at eta 2"),
             "unknown": ({"recipes": ["crops", "magic"]}, "select.recipes: Value error, unknown recipes ['magic']"),
             "queries": ({"recipes": ["gpl"]}, "select.recipes: gpl trains on LLM queries, add a `queries` section"),
             "family": ({"recipes": ["tsdae"], "families": ["dense", "sparse"]},
                        "select.families: no candidate recipe trains the sparse family; it trains crops, dropout"),
             "static": ({"families": ["dense", "multi_vector"], "static": True},
                        "select.static: a static model is distilled from a dense one; with the multi_vector family")}
    for name, (select, said) in cases.items():
        (tmp_path / name).mkdir()
        config = select_config(tmp_path / name, **select)
        assert main(["select", "--config", str(config)]) == 2
        out = capsys.readouterr().out
        assert said in " ".join(out.split()) and out.count("error:") == 1, out
        assert not (tmp_path / name / "store").exists()
    # A multi-vector candidate on a pooled yardstick, which fuses one vector a text.
    (tmp_path / "pooled").mkdir()
    config = select_config(tmp_path / "pooled", families=["multi_vector"],
                           yardstick={**YARDSTICK, "kind": "neighbours"})
    assert main(["select", "--config", str(config)]) == 2
    assert ("select.families: a multi_vector model is ranked by MaxSim on your qrels, labels, titles or an LLM's "
            "queries, not on the neighbours yardstick") in " ".join(capsys.readouterr().out.split())
    # The export folder inside the store is refused before the search, whatever its answer would be.
    (tmp_path / "inside").mkdir()
    config = select_config(tmp_path / "inside", out=str(tmp_path / "inside" / "store" / "chosen"))
    assert main(["select", "--config", str(config)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"select.out: {tmp_path / 'inside' / 'store' / 'chosen'}: inside the store" in out
    assert out.count("error:") == 1
    assert not (tmp_path / "inside" / "store" / "artifacts").exists()
    # `--static` with PCA wider than the models: one error before any stage (the tiny models are 32 wide).
    assert main(["select", "--config", str(config), "--out", str(tmp_path / "wide"), "--static"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "static.pca_dims: 256 is more than the 32 dimensions of the run's models" in out and out.count("error:") == 1
    assert not (tmp_path / "inside" / "store" / "artifacts").exists()
    (tmp_path / "corpus").mkdir()
    config = select_config(tmp_path / "corpus")
    assert main(["select", str(tmp_path / "missing.parquet"), "--config", str(config)]) == 2
    assert "missing.parquet" in capsys.readouterr().out
    assert main(["select", "--config", str(config), "--budget", "1"]) == 2
    assert capsys.readouterr().out == "error: --budget: Input should be greater than or equal to 2\n"
    assert main(["select", "--config", str(config), "--budget", "3", "--recipes", "crops", "dropout", "mlm"]) == 2
    assert "a budget of 3 steps is too small for 6 candidates at eta 2" in " ".join(capsys.readouterr().out.split())
    assert main(["select", "--config", str(config), "--qrels", str(tmp_path / "no-qrels.parquet")]) == 2
    assert "".join(capsys.readouterr().out.split()) == (f"error:{config}:evaluate.yardstick.qrels:filenotfound:"
                                                        f"{tmp_path / 'no-qrels.parquet'}")  # wrapped by the console

