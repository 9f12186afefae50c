"""Mechanics of the TSDAE, Contrastive Tension and SimCSE recipes on tiny inputs."""

import math

import pytest
import torch
from sentence_transformers.sentence_transformer.losses import ContrastiveTensionLossInBatchNegatives
from torch import nn

from tasks.config.training import TrainConfig
from tasks.encoders.models import sentence_model
from tasks.methods.infonce import InfoNCELoss, info_nce
from tasks.methods.tsdae import tsdae_loss


class FixedVector(nn.Module):
    """An encoder stand-in whose sentence vector ignores its input."""

    def __init__(self, vector: torch.Tensor):
        super().__init__()
        self.vector = vector

    def forward(self, features):
        return {"sentence_embedding": self.vector.expand(len(features["input_ids"]), -1)}


def test_tsdae_decoder_sees_only_the_sentence_vector(tiny_dir):
    model = sentence_model(tiny_dir, 32, pooling="cls")
    loss = tsdae_loss(model).eval()
    target = model.preprocess(["the original sentence that must be rebuilt"])
    vector = torch.randn(1, 32)
    loss.encoder = FixedVector(vector)
    with torch.no_grad():
        values = [loss([model.preprocess([noisy]), target], None).item()
                  for noisy in ["original rebuilt", "completely different input tokens of another length here"]]
        loss.encoder = FixedVector(vector + 1.0)
        moved = loss([model.preprocess(["original rebuilt"]), target], None).item()
    assert values[0] == values[1]  # changing the input tokens cannot change the reconstruction
    assert moved != values[0]  # ... while the sentence vector does


def test_tsdae_decoder_is_tied_to_the_encoder(tiny_dir):
    model = sentence_model(tiny_dir, 32, pooling="cls")
    loss = tsdae_loss(model)
    encoder_params = {id(p) for p in model.parameters()}
    decoder_params = list(loss.decoder.parameters())
    shared = [p for p in decoder_params if id(p) in encoder_params]
    assert len(shared) >= len(list(model.parameters())) - 2  # all but the unused pooler
    assert any("crossattention" in n for n, _ in loss.decoder.named_parameters())


def test_contrastive_tension_loss_equals_hand_computation(tiny_dir):
    model = sentence_model(tiny_dir, 32)
    ct = ContrastiveTensionLossInBatchNegatives(model, scale=20.0).eval()
    texts = ["first sentence here", "a second one", "and a third sentence"]
    features = model.preprocess(texts)
    with torch.no_grad():
        loss = ct([features], None).item()
        a = ct.model1(model.preprocess(texts))["sentence_embedding"]
        b = ct.model2(model.preprocess(texts))["sentence_embedding"]
    cos = [[torch.nn.functional.cosine_similarity(a[i], b[j], dim=0).item() * 20 for j in range(3)] for i in range(3)]
    rows = sum(-cos[i][i] + math.log(sum(math.exp(c) for c in cos[i])) for i in range(3)) / 3
    cols = sum(-cos[j][j] + math.log(sum(math.exp(cos[i][j]) for i in range(3))) for j in range(3)) / 3
    assert loss == pytest.approx((rows + cols) / 2, rel=1e-5)
    assert ct.model2 is model  # the encoder that is saved; model1 is a training-only copy


def test_simcse_one_pass_gives_the_two_copies_different_dropout_masks(tiny_dir):
    model = sentence_model(tiny_dir, 32, pooling="cls")
    loss = InfoNCELoss(model, temperature=0.05, head="mlp", one_pass=True).train()
    texts = ["one sentence", "another sentence", "a third one"]
    captured = {}
    loss.head.register_forward_hook(lambda _m, _i, out: captured.setdefault("z", out))
    torch.manual_seed(0)
    value = loss([model.preprocess(texts + texts)], None)
    anchors, positives = captured["z"].chunk(2)
    assert not torch.allclose(anchors, positives)  # dropout differs between the two copies
    assert value.item() == pytest.approx(info_nce(anchors, positives, 0.05).item(), rel=1e-6)
    assert "head" not in " ".join(model.state_dict())  # the MLP is not part of the saved model


def test_matryoshka_is_accepted_only_by_in_batch_contrastive_recipes():
    from tasks.config.training import MethodConfig, merged_train

    cfg = TrainConfig()
    ok = merged_train(cfg, MethodConfig(name="c", recipe="crops", train={"matryoshka_dims": [16, 8]}), "m")
    assert ok.matryoshka_dims == [16, 8]
    with pytest.raises(ValueError, match="matryoshka_dims apply to"):
        merged_train(cfg, MethodConfig(name="t", recipe="tsdae", train={"matryoshka_dims": [16]}), "m")
