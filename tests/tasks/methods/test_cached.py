"""Cached (GradCache) in-batch losses: the full batch's gradients from mini-batches."""


import pytest
import torch
from sentence_transformers import SparseEncoder
from sentence_transformers.multi_vector_encoder.losses import CachedMultiVectorMultipleNegativesRankingLoss
from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

from tasks.config.family_settings import MultiVectorSettings, SparseSettings
from tasks.config.recipes import RECIPES
from tasks.config.training import LoraSettings, MethodConfig, TrainConfig, merged_train
from tasks.encoders.families import multi_vector_model, splade_model
from tasks.encoders.lora import attach_lora
from tasks.encoders.models import sentence_model
from tasks.methods.cached import CachedLoss, CachedSpladeLoss, mini_batches
from tasks.methods.objectives import build_objective
from tests.helpers import tiny_encoder, with_masked_lm_head

BATCH = [(f"document {i} about topic {i % 5}, words {i * 7 % 13}", f"DOCUMENT {i}, TOPIC {i % 5}") for i in range(12)]
FULL = TrainConfig(batch_size=12, max_length=32)
CACHED = FULL.model_copy(update={"mini_batch_size": 5})  # 5 + 5 + 2 rows: the last mini-batch is short


def encoder(tmp_path_factory, dropout: float) -> str:
    return tiny_encoder(tmp_path_factory.mktemp("init") / "model", dropout)


@pytest.fixture(scope="module")
def no_dropout(tmp_path_factory):
    return encoder(tmp_path_factory, 0.0)


def gradients(init: str, recipe: str, cfg: TrainConfig, seed: int = 0, compile: bool = False,
              lora: bool = False) -> tuple[float, dict]:
    torch.manual_seed(seed)  # the same projection head on both sides
    model = sentence_model(init, cfg.max_length, compile=compile)
    if lora:  # without dropout, which would draw masks
        attach_lora(model, LoraSettings(r=4, dropout=0.0), seed)
    objective = build_objective(model, recipe, cfg, None, None)
    objective.loss.train()
    loss = objective.loss(objective.collate(BATCH), None)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in objective.loss.named_parameters() if p.grad is not None}


def assert_same(one: dict, two: dict) -> None:
    assert one.keys() == two.keys() and len(one) > 10
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("recipe", ["crops", "dropout", "simcse", "semcse", "semcse_infonce"])
def test_cached_gradients_equal_the_full_batch_s(no_dropout, recipe):
    assert RECIPES[recipe].mini_batches
    full_loss, full = gradients(no_dropout, recipe, FULL)
    cached_loss, cached = gradients(no_dropout, recipe, CACHED)
    assert cached_loss == pytest.approx(full_loss, rel=1e-6)
    assert_same(full, {n.removeprefix("loss."): g for n, g in cached.items()})


def test_cached_gradients_of_a_lora_adapter_equal_the_full_batch_s(no_dropout):
    full_loss, full = gradients(no_dropout, "crops", FULL, lora=True)
    cached_loss, cached = gradients(no_dropout, "crops", CACHED, lora=True)
    assert cached_loss == pytest.approx(full_loss, rel=1e-6)
    assert full and all("lora_" in name for name in full)  # only the adapter has gradients
    assert_same(full, {n.removeprefix("loss."): g for n, g in cached.items()})


@pytest.fixture(scope="module")
def no_dropout_mlm(no_dropout, tmp_path_factory):
    """no_dropout's encoder with a masked-LM head: a SPLADE base."""
    return with_masked_lm_head(no_dropout, tmp_path_factory.mktemp("mlm") / "model")


def splade(base: str, cfg: TrainConfig) -> SparseEncoder:
    return splade_model(base, SPLADE, cfg.max_length, "cpu", seed=0)


SPLADE = SparseSettings(kind="splade", document_regularizer=1e-3, query_regularizer=1e-3)  # weighing in the gradients
MULTI_VECTOR = MultiVectorSettings(dim=16, query_expansion=16)  # the anchors widened by [MASK] tokens, cached too


# A multi-vector model trains its recipes by sentence-transformers' MaxSim InfoNCE, a SPLADE model by its InfoNCE and
# FLOPS regularisers; their cached forms take hard negatives too (gpl's).
@pytest.mark.parametrize("family", ["multi_vector", "splade"])
@pytest.mark.parametrize("recipe", ["crops", "gpl"])
def test_a_family_s_cached_gradients_equal_the_full_batch_s(no_dropout, no_dropout_mlm, family, recipe):
    rows = [(a, p, BATCH[(i + 5) % len(BATCH)][1]) for i, (a, p) in enumerate(BATCH)] if recipe == "gpl" else BATCH
    settings, cached_loss_class, head = {
        "multi_vector": (MULTI_VECTOR, CachedMultiVectorMultipleNegativesRankingLoss, "1.linear.weight"),
        "splade": (SPLADE, CachedSpladeLoss, "0.model.cls.predictions.transform.dense.weight")}[family]
    method = MethodConfig(name="m", recipe=recipe, family="sparse" if family == "splade" else family,
                          **{"sparse" if family == "splade" else family: settings}, train={"mini_batch_size": 5})
    grads = {}
    for cfg in (FULL, merged_train(CACHED, method, "methods.0")):  # as the config allows it
        model = (splade(no_dropout_mlm, cfg) if family == "splade" else
                 multi_vector_model(sentence_model(no_dropout, cfg.max_length), settings, seed=0))
        objective = build_objective(model, recipe, cfg, None, None, family=settings)
        loss_module = objective.loss.loss if family == "splade" else objective.loss  # SPLADE's terms summed
        assert isinstance(loss_module, cached_loss_class) == (cfg is not FULL)
        if family == "multi_vector":
            assert objective.collate(rows)[0]["query_expansion_positions"].any()
        loss = objective.loss(objective.collate(rows), None)
        loss.backward()
        grads[cfg is not FULL] = loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.grad is not None}
    (full_loss, full), (cached_loss, cached) = grads[False], grads[True]
    assert cached_loss == pytest.approx(full_loss, rel=1e-6)
    assert head in full and full.keys() == cached.keys() and len(full) > 10  # the head trains, the encoder under it
    for name, gradient in full.items():
        if family == "splade":  # float32's rounding of sums over 30,522 terms, of gradients up to 45 here: to 1e-5 of
            difference = (cached[name] - gradient).norm().item()  # each tensor's norm
            assert difference <= 1e-5 * gradient.norm().item() + 1e-6, name
        else:
            torch.testing.assert_close(cached[name], gradient, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", ["multi_vector", "splade"])
def test_a_family_s_backward_pass_re_embeds_under_the_forward_pass_s_autocast(no_dropout, no_dropout_mlm, family):
    settings = MULTI_VECTOR if family == "multi_vector" else SPLADE
    model = (multi_vector_model(sentence_model(no_dropout, CACHED.max_length), settings, seed=0)
             if family == "multi_vector" else splade(no_dropout_mlm, CACHED))
    objective = build_objective(model, "crops", CACHED, None, None, family=settings)
    autocast = []
    model[0].register_forward_hook(lambda *_: autocast.append(torch.is_autocast_enabled("cpu")))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as train_model runs a bf16 step: the forward pass only
        loss = objective.loss(objective.collate(BATCH), None)
    loss.backward()
    assert autocast == [True] * (2 * 2 * 3)  # two passes over 2 columns x 3 mini-batches (5 + 5 + 2 rows)


def test_cached_gradients_equal_sentence_transformers_cached_mnrl(no_dropout):
    _, ours = gradients(no_dropout, "crops", CACHED)
    model = sentence_model(no_dropout, FULL.max_length)
    theirs = CachedMultipleNegativesRankingLoss(model, scale=1 / FULL.temperature, mini_batch_size=5)
    objective = build_objective(model, "crops", FULL, None, None)  # the same tokenised batch
    theirs(objective.collate(BATCH), None).backward()
    assert_same({n.removeprefix("loss.model."): g for n, g in ours.items()},
                {n: p.grad for n, p in model.named_parameters() if p.grad is not None})


# Compiled (train.compile), the first pass runs a no-grad graph and the second a training graph: both must
# draw the same masks from the same RNG state. Compiling takes seconds a graph here, hence slow, and with
# even mini-batches (6 + 6 rows: one shape, two graphs).
@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_with_dropout_the_second_pass_draws_the_first_pass_s_masks(tmp_path_factory, compile):
    init = encoder(tmp_path_factory, 0.3)
    cfg = CACHED.model_copy(update={"mini_batch_size": 6}) if compile else CACHED
    _, cached = gradients(init, "crops", cfg, seed=1, compile=compile)
    # What the cached loss must equal: the same mini-batches embedded in the same order from the same
    # seed, with gradients all along, so every mask is drawn once.
    torch.manual_seed(1)
    model = sentence_model(init, FULL.max_length, compile=compile)
    loss = build_objective(model, "crops", FULL, None, None)
    loss.loss.train()
    features = loss.collate(BATCH)
    parts = [[loss.loss.embed([batch])[0] for batch in mini_batches(f, cfg.mini_batch_size)] for f in features]
    loss.loss.score([torch.cat(p) for p in parts]).backward()
    assert_same({n: p.grad for n, p in loss.loss.named_parameters() if p.grad is not None},
                {n.removeprefix("loss."): g for n, g in cached.items()})
    if compile:  # dropout does draw masks there: another seed, other gradients (and no new graphs)
        _, reseeded = gradients(init, "crops", cfg, seed=2, compile=compile)
        assert any(not torch.allclose(reseeded[n], cached[n], rtol=1e-3) for n in cached)
    else:
        _, full = gradients(init, "crops", FULL, seed=1)  # one pass over 12 rows draws other masks
        assert any(not torch.allclose(full[n], cached["loss." + n], rtol=1e-3) for n in full)


def test_a_cached_loss_keeps_its_inner_loss_s_parameters(no_dropout):
    inner = build_objective(sentence_model(no_dropout, 32), "simcse", FULL, None, None).loss
    assert list(CachedLoss(inner, 4).parameters()) == list(inner.parameters())
