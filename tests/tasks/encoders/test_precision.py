"""Mixed precision: bf16 encoding scores next to fp32's, the precision choices, the saved dtype."""

import numpy as np
import pytest
import torch
from safetensors import safe_open
from sentence_transformers import SentenceTransformer

from tasks.config.base import DEFAULT_MODEL, InputError
from tasks.core import eval_sets
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.models import sentence_model
from tasks.encoders.precision import MixedPrecision, autocast_dtype, cpu_has_bf16
from tasks.metrics.sts import sts_spearman
from tests.helpers import STSB


@pytest.fixture(scope="module")
def stsb_scores():
    """STS-B test Spearman of the base model per evaluate.dtype, and its embeddings."""
    pairs = eval_sets.read_pairs(str(STSB), "test", 400)
    texts = pairs["sentence1"].tolist() + pairs["sentence2"].tolist()
    out = {}
    for dtype in ("fp32", "bf16", "fp16"):
        emb = PooledEncoder(DEFAULT_MODEL, "cpu", dtype=dtype).encode(texts, max_length=128)
        out[dtype] = sts_spearman(emb[: len(pairs)], emb[len(pairs):], pairs["score"].to_numpy()), emb
    return out


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_lower_precision_encoding_scores_stay_within_0_002_of_fp32(stsb_scores, dtype):
    (fp32, exact), (low, emb) = stsb_scores["fp32"], stsb_scores[dtype]
    assert fp32 > 0.8  # a real model on real pairs
    assert abs(low - fp32) < 0.002
    assert not np.allclose(emb, exact, atol=1e-4)  # it did run in the lower precision


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_on_a_device_that_multiplies_it_natively_else_fp32(monkeypatch, native):
    # which CPU probe answers is this machine's: both answers, as each kind of CPU would give them
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: native)
    assert cpu_has_bf16() is native
    assert autocast_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)
    assert autocast_dtype("bf16", "cpu") == torch.bfloat16
    assert autocast_dtype("fp32", "cpu") == torch.float32
    if torch.cuda.is_available():
        assert autocast_dtype("auto", "cuda") == (
            torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32)


def test_fp16_training_on_the_cpu_is_refused_naming_the_field():
    with pytest.raises(InputError, match="train.precision: fp16 training needs a CUDA GPU"):
        MixedPrecision("fp16", torch.device("cpu"))
    assert autocast_dtype("fp16", "cpu") == torch.float16  # encoding in fp16 runs on a CPU


def test_models_train_in_float32_with_sdpa_attention(tmp_path):
    model = sentence_model(DEFAULT_MODEL, 32)
    model.to(torch.bfloat16).save(str(tmp_path / "bf16"))  # what train.save_dtype: bfloat16 saves
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as saved:
        assert {saved.get_tensor(k).dtype for k in saved.keys()} == {torch.bfloat16}
    assert SentenceTransformer(str(tmp_path / "bf16")).encode(["a sentence"]).shape == (1, 384)
    again = sentence_model(str(tmp_path / "bf16"), 32)  # master weights: float32 whatever was saved
    assert {p.dtype for p in again.parameters()} == {torch.float32}
    assert again.transformers_model.config._attn_implementation == "sdpa"
