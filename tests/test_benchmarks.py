"""The training, collating and encoding benchmarks run to their JSON line at a tiny size on the CPU, so a crash fails CI
(nothing else runs them); their rows are sized from the rows an epoch of the demo corpus really gives (1,741 crops
of its 2,000 documents): train_gpu.py guessed 1,800 and stopped at batch 256 and 512."""

import json
import math
import os
import statistics
import sys

import pandas as pd
import pytest

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.select import rung_steps
from tests import processes
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # benchmark processes: the demo corpus's views, two trainers each


def benchmark(*argv: str) -> str:
    done = processes.run([sys.executable, *argv], cwd=REPO / "benchmarks", capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_train_step_times_recipes_and_alternates_crops_with_the_trainer():
    out = json.loads(benchmark("train_step.py", "--random-init", "--batch-size", "4", "--steps", "2",
                               "--max-length", "64", "--recipes", "crops,tsdae", "--rounds", "2", "--device", "cpu",
                               "--profile", "--group-by-length"))
    assert set(out["rows_per_s"]) == {"crops", "tsdae"} and out["rounds"] == 2
    assert set(out["grouped_rows_per_s"]) == {"tsdae, group_by_length"}  # crops' batches are its negatives
    padding = out["padding_share_by_side"]
    assert set(padding) == {"tsdae", "tsdae, group_by_length"} and padding["tsdae, group_by_length"] < padding["tsdae"]
    assert len(out["crops_rounds"]) == len(out["padding_free_rounds"]) == len(out["st_rounds"]) == 2
    assert out["embforge_pairs_per_s"] == pytest.approx(statistics.median(out["crops_rounds"]), abs=0.01)
    assert out["padding_free_pairs_per_s"] == pytest.approx(statistics.median(out["padding_free_rounds"]), abs=0.01)
    assert out["ratio_embforge_over_st"] > 0 and out["ratio_padding_free_over_st"] > 0
    assert 0 < out["padding_share"] < 1
    for side in ("crops", "crops_padding_free"):  # --profile: every part of a step took some time
        assert set(out["step_split_s"][side]) == {"data", "forward", "backward", "optimizer", "other"}
        assert all(seconds > 0 for seconds in out["step_split_s"][side].values())
        assert out["prepared_ahead_s"][side] > 0  # read and padded on the background thread
    assert out["tokens_stage_ms_per_batch"] > 0


def test_eval_encode_runs_on_the_cpu(tiny_dir):
    out = json.loads(benchmark("eval_encode.py", "--model", tiny_dir, "--docs", "24", "--batch-size", "8",
                               "--rounds", "2", "--sts-pairs", "24"))
    assert (out["docs"], out["batch_size"], out["rounds"], out["device"]) == (24, 8, 2, "cpu")
    sides = ("embforge, torch", "embforge, onnx", "embforge, openvino", "embforge, torch, tokenizing the texts",
             "embforge, torch, all layers x 3 poolings", "sentence-transformers encode (torch)")
    assert set(out["docs_per_s"]) == set(sides)
    assert all(rate > 0 for rate in out["docs_per_s"].values()) and out["ratio"] > 0 and out["texts_ratio"] > 0
    assert out["text_tokens_ms"] > 0
    assert out["min_cosine"] >= 0.999 and max(out["max_score_change"].values()) <= 0.001  # the same computation


def test_collate_compares_stored_ids_and_texts_with_transformers_conversion(tiny_dir):
    out = json.loads(benchmark("collate.py", "--model", tiny_dir, "--batches", "4,8", "--max-length", "32",
                               "--rounds", "2", "--repeats", "1"))
    assert [r["batch"] for r in out["results"]] == [4, 8] and (out["rounds"], out["repeats"]) == (2, 1)
    for r in out["results"]:
        assert all(len(rounds) == 2 and min(rounds) > 0 for rounds in r["rounds_ms"].values())
        assert set(r["rounds_ms"]) == {"embforge, stored ids", "embforge, texts", "transformers' conversion"}
        assert set(r["speedup"]) == {"embforge, stored ids", "embforge, texts"}  # the same tensors, or it stops
        assert min(r["speedup"].values()) > 0


def test_train_gpu_runs_on_the_cpu():
    out = json.loads(benchmark("train_gpu.py", "--models", "random-tiny", "--batches", "4", "--steps", "2",
                               "--rounds", "2", "--max-length", "32", "--device", "cpu", "--profile", "--ceiling",
                               "--compile", "--cuda-graphs"))
    (result,) = out["results"]
    assert (result["model"], result["batch"], out["steps"], out["gpu"]) == ("random-tiny", 4, 2, None)
    for side in ("embforge", "padding_free", "compiled", "compiled_padding_free", "cuda_graphs", "st_trainer"):
        assert len(result[side]["rounds"]) == 2 and result[side]["over_st"] > 0
        assert result[side]["pairs_per_s"] == pytest.approx(statistics.median(result[side]["rounds"]), abs=0.01)
        assert result[side]["mfu"] is None and result[side]["tokens_per_s"] > 0  # no peak FLOP/s on a CPU
    assert result["st_trainer"]["over_st"] == 1
    # --profile: the step's parts, and what was prepared ahead
    for side in ("embforge", "padding_free", "compiled", "compiled_padding_free", "cuda_graphs"):
        profile = result["profile"][side]
        assert set(profile["step_split_s"]) == {"data", "forward", "backward", "optimizer", "other"}
        assert profile["prepared_ahead_s"] > 0 and profile["gpu_busy"] is None
    assert list(result["ceiling"]) == ["eager", "bf16_weights", "compiled"]  # CUDA graphs on CUDA only
    assert all(c["step_s"] > 0 and c["tokens_per_s"] > 0 and c["mfu"] is None for c in result["ceiling"].values())


def test_train_decoder_times_llm2vecs_stages_with_lora_on_the_cpu():
    out = json.loads(benchmark("train_decoder.py", "--batch-size", "4", "--max-length", "32", "--steps", "2",
                               "--device", "cpu"))
    assert out["shape"] == "tiny" and out["lora"] and out["checkpointing"]
    assert set(out["stages"]) == {"mntp", "dropout"}
    for stage in out["stages"].values():
        assert stage["tokens_per_s"] > 0 and stage["peak_memory_gib"] is None  # no CUDA here
        assert 0 < stage["trainable_share"] < 0.5  # the adapters only


def test_rows_beyond_one_epoch_come_from_more_epochs(tmp_path):
    rows = benchmark("-c", "import sys; from train_step import demo_rows; from storage.store import ArtifactStore; "
                     f"print(demo_rows('crops', 2000, ArtifactStore({str(tmp_path)!r})).num_rows)")
    assert rows == "2000"


def test_paper_configs_scale_every_paper_config_and_train_one_at_cpu_size(tmp_path):
    checked = json.loads(benchmark("paper_configs.py", "--check-only", "--store", str(tmp_path / "a" / "store")))
    assert set(checked) == {p.stem for p in (REPO / "configs" / "paper").glob("*.yaml")}  # each scales validly
    out = json.loads(benchmark("paper_configs.py", "--configs", "crops_vs_dropout", "--docs", "64", "--steps", "6",
                               "--store", str(tmp_path / "b" / "store")))
    run = out["crops_vs_dropout"]
    assert run["status"] == "completed" and set(run["methods"]) == {"crops", "dropout"}
    catalog = Catalog(ArtifactStore(tmp_path / "b" / "store"))
    for name, method in run["methods"].items():
        # the chance level of its largest batch: 64 rows, or an epoch's rows when the view of 64 documents has fewer
        [pairs] = catalog.query("SELECT key FROM run_stages WHERE stage = 'pairs' AND label = ?", [name])
        rows = catalog.store.manifest(ArtifactRef("pairs", pairs["key"]))["extra"]["documents"]
        assert method["health"] == "healthy" and method["chance"] == pytest.approx(math.log(min(64, rows)), abs=1e-3)
        assert 0 < method["loss_last"] and 0 <= method["knn"] <= 1
    assert 0 <= run["untrained_knn"] <= 1


def test_static_encode_times_the_static_model_beside_its_teacher(tiny_dir):
    out = json.loads(benchmark("static_encode.py", "--teacher", tiny_dir, "--docs", "40", "--limit", "60",
                               "--rounds", "2", "--pca-dims", "16", "--sentences", "200"))
    assert (out["docs"], out["rounds"]) == (40, 2)
    assert set(out["docs_per_s"]) == {"static (embforge's encoder)", "teacher (SentenceTransformer.encode)"}
    assert all(len(r) == 2 and min(r) > 0 for r in out["rounds_docs_per_s"].values())
    assert out["ratio"] > 0 and out["distill_s"] > 0 and out["distill_and_tokenlearn_s"] > 0
    assert 0 < out["size_ratio"] and out["size_mb"]["static"] > 0


def test_select_recipe_selects_then_trains_every_candidate_and_judges_with_the_labels(tmp_path):
    tiny = ["select_recipe.py", "--corpora", "demo", "--limit", "300", "--store", str(tmp_path / "store"), "--set",
            "model.random_init={layers: 1, hidden: 32, heads: 2, intermediate: 64}", "--set", "select.budget=24",
            "--set", "select.lrs=[3.0e-3]", "--set", "select.recipes=[crops, dropout]", "--set",
            "train.batch_size=16", "--set", "train.max_length=64", "--set", "evaluate.max_length=64"]
    out = json.loads(benchmark(*tiny))
    [demo] = out["corpora"]
    assert demo["documents"] == 300 and set(demo["knn"]) == set(demo["yardstick"]) == {"crops@0.003", "dropout@0.003"}
    assert demo["best"] == max(demo["knn"], key=demo["knn"].get) and demo["low"] <= demo["difference"] <= demo["high"]
    assert demo["search_steps"] == 8 + 24 and demo["exhaustive_steps"] == 48  # one rung of 8 steps, the winner to 24
    assert -1 <= demo["kendall_tau"] <= 1 and out["all_within"] == demo["within"]
    over_base = demo["over_base"]
    assert over_base["low"] <= over_base["mean"] <= over_base["high"]
    assert (demo["chosen"] == "base") == (over_base["mean"] == 0)  # an answer of the base is the base
    assert demo["confirmed_by"] is None and demo["decided_by"]["n"] >= 2  # the titles decided (no pool to confirm)
    # --judge answer trains nothing more: the search's own models, judged from the embeddings it stored
    [stored] = json.loads(benchmark(*tiny, "--judge", "answer"))["corpora"]
    assert stored["chosen"] == demo["chosen"] and stored["exhaustive_s"] is None and stored["knn_documents"] == 300
    assert stored["base_knn"] == pytest.approx(demo["base_knn"])  # the untrained model's vectors, stored by both runs
    [rung, last] = stored["rungs"]
    assert rung["steps"] == 8 and set(rung["knn"]) == {"crops@0.003@8", "dropout@0.003@8"} and rung["tau"] is None
    assert last["steps"] == 24 and len(last["knn"]) == 1  # the winner, trained to the budget
    assert demo["chosen"] in {"base", *last["knn"]}


def test_select_retrieval_selects_among_families_then_judges_the_answer_on_queries_it_never_saw(tmp_path):
    docs = pd.read_parquet(REPO / "configs" / "data" / "scifact_test.parquet").head(300)
    queries = pd.read_parquet(REPO / "configs" / "data" / "scifact_test_queries.parquet")
    docs.to_parquet(tmp_path / "corpus.parquet")
    queries[queries["doc_id"].isin(docs["doc_id"])].to_parquet(tmp_path / "queries.parquet")
    out = json.loads(benchmark(
        "select_retrieval.py", "--corpus", str(tmp_path / "corpus.parquet"), "--queries",
        str(tmp_path / "queries.parquet"), "--store", str(tmp_path / "store"), "--max-length", "64",
        "--set", "model.random_init={layers: 1, hidden: 32, heads: 2, intermediate: 64}", "--set", "select.budget=8",
        "--set", "select.lrs=[3.0e-3]", "--set", "select.recipes=[crops]", "--set", "select.multi_vector={dim: 16}",
        "--set", "train.batch_size=16", "--set", "train.max_length=64", "--set", "evaluate.max_length=64"))
    [rung] = rung_steps(8, 2, 3)  # configs/select.yaml's eta
    ladder = {(row["candidate"], row["steps"]): row["family"] for row in out["ladder"]}
    assert ladder[("crops@0.003", rung)] == "dense" and ladder[("crops-multi-vector@0.003", rung)] == "multi_vector"
    assert out["cost"]["candidates"] == 2 and out["cost"]["trained_steps"] == rung + 8
    judged = out["judged"]
    assert "base" in judged and all(0 <= m["ndcg_at_10"] <= 1 for m in judged.values())
    runner_up = [name for name in judged if name != "base" and not name.startswith(f"{out['chosen']}@")]
    assert len(judged) == (2 if out["chosen"] == "base" else 3) and len(runner_up) == 1
    for name, model in judged.items():  # each against the untrained model, paired over the same claims
        versus = model["versus_base"]
        assert versus["low"] <= versus["mean"] <= versus["high"]
        assert versus["mean"] == pytest.approx(model["ndcg_at_10"] - judged["base"]["ndcg_at_10"], abs=1e-9)


def test_sparse_evaluate_compares_the_codes_kept_sparse_with_dense_rows_on_the_same_scores():
    out = json.loads(benchmark("sparse_evaluate.py", "--docs", "60", "--width", "400", "--active", "6",
                               "--classes", "3", "--rounds", "2"))
    assert (out["docs"], out["width"], out["rounds"]) == (60, 400, 2)
    assert set(out["seconds"]) == set(out["peak_mib"]) == {"sparse", "dense rows"}
    assert all(len(v) == 2 and min(v) > 0 for v in [*out["rounds_s"].values(), *out["peaks_mib"].values()])
    assert out["max_score_difference"] <= 1e-6 and len(out["scores"]) == 5  # kNN and the four geometry rows
    assert out["memory_ratio"] > 1  # the dense side holds a (60 x 400) copy the sparse one never makes


def test_sparse_search_compares_posting_lists_with_dense_rows_on_the_same_scores():
    out = json.loads(benchmark("sparse_search.py", "--widths", "300,40", "--docs", "50", "--active", "5",
                               "--query-active", "3", "--queries", "4", "--rounds", "2"))
    assert [r["width"] for r in out["results"]] == [300, 40] and (out["queries"], out["rounds"]) == (4, 2)
    for r in out["results"]:
        assert set(r["ms_per_query"]) == {"postings", "dense rows"} and r["speedup"] > 0
        assert all(len(rounds) == 2 and min(rounds) > 0 for rounds in r["rounds_ms"].values())
        assert r["max_score_difference"] <= 1e-4  # the same scores, or it stops


def test_maxsim_index_compares_the_indexed_search_with_exact_maxsim_on_the_same_claims():
    out = json.loads(benchmark("maxsim_index.py", "--docs", "150", "--max-length", "32", "--nearest", "2,100000",
                               "--probes", "1,100000", "--timed", "3"))
    assert out["documents"] == 150 and out["claims"] >= 2 and out["tokens"] > 150 and out["dim"] == 128
    assert out["index_bytes"] < out["token_vector_bytes"] and out["build_s"] > 0 and out["exact_ms_per_query"] > 0
    settings = {(r["nearest"], r["probes"]): r for r in out["results"]}
    assert set(settings) == {(2, 1), (2, 100000), (100000, 1), (100000, 100000)}
    every = settings[100000, 100000]  # every token of every list: exact MaxSim's scores, and so its ranks
    assert every["versus_exact"] == {"mean": 0.0, "low": 0.0, "high": 0.0} and every["exact_top10_kept"] == 1.0
    assert every["candidates"] == 150 and every["ndcg_at_10"] == pytest.approx(out["exact_ndcg_at_10"])
    assert settings[2, 1]["candidates"] < 150 and all(r["ms_per_query"] > 0 for r in out["results"])
