"""Several processes, one global batch: 2 gloo processes x 8 rows train exactly as 1 process x 16."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.config.recipes import RECIPES
from tasks.encoders.models import sentence_model
from tasks.methods.distributed import gather_rows, shard
from tests.helpers import REPO, tiny_encoder, with_masked_lm_head
from tests.tasks.methods.distributed_steps import FAMILY_RECIPES, ragged, three_steps, with_negatives
from tests.tasks.methods.distributed_steps import RECIPES as COMPARED


def test_shards_cover_the_batch_once_in_order():
    rows = list(range(11))
    for size in (1, 2, 3, 4):
        parts = [list(shard(rows, rank, size)) for rank in range(size)]
        assert sum(parts, []) == rows and max(map(len, parts)) - min(map(len, parts)) <= 1


def test_one_process_gathers_nothing():
    rows = torch.randn(4, 3, requires_grad=True)
    assert gather_rows(rows) is rows


def test_the_compared_recipes_are_the_registry_s_in_batch_ones():
    assert set(COMPARED) <= {name for name, r in RECIPES.items() if r.in_batch_negatives}
    assert {name for name, r in RECIPES.items() if r.in_batch_negatives} == {
        "crops", "dropout", "simcse", "ct", "semcse", "semcse_infonce", "retromae_infonce", "gpl", "inpars"}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """(init folder, its masked-LM copy, pairs file, what 2 torchrun processes trained)."""
    tmp = tmp_path_factory.mktemp("ddp")
    init = tmp / "init"
    tiny_encoder(init, dropout=0.0)  # dropout off: the processes draw their own masks
    mlm = with_masked_lm_head(str(init), tmp / "mlm")
    texts = [f"document {i} about topic {i % 5}, with words {i * 7 % 13} and {i * 3 % 11}" for i in range(48)]
    pairs = tmp / "pairs.parquet"
    rows = {"epoch": pa.array([0] * 48, pa.int32()), "anchor": texts, "positive": [t.upper() for t in texts]}
    pq.write_table(pa.table(rows), pairs, row_group_size=10)
    # Each row's hard negative (gpl) is another row's positive: gathered per column, it stays that row's.
    pq.write_table(pa.table({**rows, "negative": [texts[(i + 7) % 48].upper() for i in range(48)]}),
                   with_negatives(str(pairs)), row_group_size=10)
    texts = [f"document {i} about topic {i % 5}" + " with more words" * (i % 9) for i in range(45)]  # 5 to 32 tokens
    rows = {"epoch": pa.array([0] * 45, pa.int32()), "anchor": texts[::-1], "positive": [t.upper() for t in texts]}
    pq.write_table(pa.table(rows), ragged(str(pairs)), row_group_size=10)
    pq.write_table(pa.table({**rows, "negative": [texts[(i + 7) % 45].upper() for i in range(45)]}),
                   with_negatives(ragged(str(pairs))), row_group_size=10)
    return str(init), mlm, str(pairs), torchrun(init, mlm, pairs, tmp / "two.pt")


def torchrun(init, mlm, pairs, out, *mode: str) -> dict:
    """What 2 torchrun processes trained (distributed_steps.py)."""
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                    str(REPO / "tests/tasks/methods/distributed_steps.py"), str(init), str(mlm), str(pairs), str(out),
                    *mode],
                   check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                   timeout=600)
    return torch.load(out)


@pytest.mark.parametrize("recipe", COMPARED)
def test_two_processes_of_8_rows_train_as_one_of_16(two_processes, recipe, tmp_path):
    init, _, pairs, trained = two_processes
    one = three_steps(init, pairs, recipe, True, tmp_path)
    two = trained[(recipe, True)]
    assert len(one["losses"]) == 3
    assert one["losses"] == pytest.approx(two["losses"], rel=1e-5, abs=1e-6)
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-5, msg=name)

    # Without the gather each process's rows meet only its own 7 negatives: another loss, other weights.
    alone = trained[(recipe, False)]
    assert alone["losses"][0] != pytest.approx(one["losses"][0], rel=1e-3)
    assert any(not torch.allclose(alone["weights"][n], w, rtol=1e-4, atol=1e-5) for n, w in one["weights"].items())


def test_two_processes_train_a_lora_adapter_as_one(two_processes, tmp_path):
    init, _, pairs, trained = two_processes
    one, two = three_steps(init, pairs, "crops", True, tmp_path, lora=True), trained["lora"]
    assert one["losses"] == pytest.approx(two["losses"], rel=1e-5, abs=1e-6)
    assert one["weights"].keys() == two["weights"].keys()
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-5, msg=name)
    # only the adapter trained: every weight of the model itself is the init's (peft names it `base_layer`)
    base = sentence_model(init, 32).state_dict()
    frozen = {name.replace(".base_layer", ""): w for name, w in two["weights"].items() if "lora_" not in name}
    assert frozen.keys() == base.keys() and all(torch.equal(w, base[name]) for name, w in frozen.items())
    assert any(name.endswith("lora_B.default.weight") and w.abs().sum() > 0 for name, w in two["weights"].items())


@pytest.mark.slow  # compiling
def test_two_compiled_processes_train_as_one_plain_process(two_processes, tmp_path):
    # train.compile with devices > 1: DistributedDataParallel around the compiled encoder
    init, mlm, pairs, _ = two_processes
    two = torchrun(init, mlm, pairs, tmp_path / "compiled.pt", "compiled")["compiled"]
    one = three_steps(init, pairs, "crops", True, tmp_path)
    assert two["graphs"] > 0 and one["graphs"] == 0
    assert one["losses"] == pytest.approx(two["losses"], rel=1e-5, abs=1e-6)
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-5, msg=name)


# A family's loss (sentence-transformers') reads its model's outputs gathered from every process: the token vectors and
# masks of a multi-vector model (each process's filled to the longest; hard negatives a column of their own; queries
# widened by [MASK] tokens), CSR's dense vectors before its autoencoder (whose count of each code's last use then
# follows every row), SPLADE's term weights (its FLOPS regularisers square the batch's mean weights: over 8 rows they
# are another number). The multi-vector and CSR models train on ragged rows, 8 and 7 a process (distributed_steps.py).
@pytest.mark.parametrize(("family", "recipe"), FAMILY_RECIPES)
def test_two_processes_train_each_family_as_one(two_processes, family, recipe, tmp_path):
    init, mlm, pairs, trained = two_processes
    one = three_steps(init, pairs, recipe, True, tmp_path, family=family, mlm_dir=mlm)
    two = trained[(family, recipe, True)]
    assert len(one["losses"]) == 3
    assert one["losses"] == pytest.approx(two["losses"], rel=1e-5, abs=1e-6)
    assert one["weights"].keys() == two["weights"].keys()
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-5, msg=name)

    alone = trained[(family, recipe, False)]
    assert alone["losses"][0] != pytest.approx(one["losses"][0], rel=1e-3)
