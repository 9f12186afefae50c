"""RetroMAE and MLM losses on a tiny random BERT (hidden 32, 1 layer) with MiniLM's tokenizer."""

import pytest
import torch
from sentence_transformers import SentenceTransformer
from torch import nn

from tasks.config.training import MethodConfig
from tasks.encoders.models import sentence_model
from tasks.methods.mlm import MaskedLMLoss, masked_lm_head
from tasks.methods.retromae import RetroMAELoss, decoder_attention_mask, retromae_features

TEXTS = ["Unbelievable hepatocellular carcinoma outcomes were reported.",
         "The patient recovered.",
         "Antibiotic prophylaxis reduced postoperative infections in children.",
         "No change."]
POSITIVES = ["Survival improved after resection.", "She went home on day three.",
             "Wound infections were rare.", "Results were similar."]

# The papers' settings, as a method config resolves them.
PAPER = MethodConfig(name="retromae", recipe="retromae")


@pytest.fixture
def model(tiny_dir):
    """A fresh copy per test: the tests train it."""
    return sentence_model(tiny_dir, max_length=32, pooling="cls")


def vocab_params(module: nn.Module, model: SentenceTransformer) -> list[nn.Parameter]:
    vocab = model.transformers_model.get_input_embeddings().num_embeddings
    return [p for p in module.parameters() if p.dim() == 2 and p.shape[0] == vocab]


def test_decoder_attention_mask_rules():
    torch.manual_seed(0)
    B, L = 64, 40
    lengths = torch.randint(3, L + 1, (B,))
    attention = (torch.arange(L)[None] < lengths[:, None]).long()
    mask = decoder_attention_mask(attention, 0.5)
    assert mask.dtype == torch.bool and mask.shape == (B, L, L)
    assert not mask.diagonal(dim1=1, dim2=2)[:, 1:].any()  # never itself (row 0's "itself" is h)
    assert mask[:, :, 0].all()
    assert not mask[:, 0, 1:].any()
    assert not (mask & ~attention.bool()[:, None, :]).any()  # never padding
    # Other real columns of real rows: j >= 1, j != i, j < length.
    others = attention.bool()[:, :, None] & attention.bool()[:, None, :]
    others[:, :, 0] = False
    others[:, 0, :] = False
    others &= ~torch.eye(L, dtype=torch.bool)
    assert abs(mask[others].float().mean().item() - 0.5) < 0.01


def test_retromae_features_word_ids(model):
    f = retromae_features(model, ["unbelievable tokenization", "no"])
    ids, words = f["input_ids"], f["word_ids"]
    assert words.shape == ids.shape and words.dtype == torch.long
    special = torch.isin(ids, torch.tensor(model.tokenizer.all_special_ids))
    assert ((words == -1) == special).all()  # [CLS], [SEP], [PAD]
    assert words[0].tolist() == [-1, 0, 1, 1, -1]  # "tokenization" is two tokens: one word
    tokens = model.tokenizer(["unbelievable tokenization", "no"], padding=True, return_tensors="pt")
    assert f.keys() == {*tokens, "word_ids"} and all(torch.equal(f[k], tokens[k]) for k in tokens)


def test_retromae_loss_trains_encoder_and_decoder(model):
    torch.manual_seed(0)
    loss_fn = RetroMAELoss(model, PAPER.resolved_mask_ratio, PAPER.resolved_decoder_visible)
    loss = loss_fn([retromae_features(model, TEXTS)])
    assert torch.isfinite(loss)
    loss.backward()
    encoder = model.transformers_model
    for name, p in list(encoder.named_parameters()) + list(loss_fn.decoder.named_parameters()):
        if "pooler" not in name:  # BERT's pooler is not used by either loss
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_decoder_and_head_share_the_encoder_embeddings(model):
    loss_fn = RetroMAELoss(model, PAPER.resolved_mask_ratio, PAPER.resolved_decoder_visible)
    embedding = model.transformers_model.get_input_embeddings().weight
    projection = [m for m in loss_fn.head.modules() if isinstance(m, nn.Linear)][-1]
    assert projection.weight is embedding
    # The loss module holds exactly one vocab-sized matrix (the encoder's), and the decoder none.
    assert [p is embedding for p in vocab_params(loss_fn, model)] == [True]
    assert vocab_params(loss_fn.decoder, model) == []


def test_infonce_term_is_added_for_the_same_random_draws(model):
    loss_fn = RetroMAELoss(model, PAPER.resolved_mask_ratio, PAPER.resolved_decoder_visible, temperature=0.05)
    features = [retromae_features(model, TEXTS), retromae_features(model, POSITIVES)]
    torch.manual_seed(3)
    terms = loss_fn.losses(features)
    with_nce = sum(terms.values())
    loss_fn.temperature = None
    torch.manual_seed(3)  # same masks, decoder masks and dropout as above
    without = loss_fn(features)
    assert set(terms) == {"encoder", "decoder", "infonce"}
    assert terms["infonce"] > 0
    assert torch.allclose(with_nce - without, terms["infonce"], atol=1e-5)
    loss_fn.temperature = 0.05
    with pytest.raises(ValueError):
        loss_fn(features[:1])


def test_masked_lm_loss_backpropagates_and_ties_head(model):
    torch.manual_seed(0)
    loss_fn = MaskedLMLoss(model, MethodConfig(name="m", recipe="mlm").resolved_mask_ratio)
    projection = [m for m in loss_fn.head.modules() if isinstance(m, nn.Linear)][-1]
    assert projection.weight is model.transformers_model.get_input_embeddings().weight
    loss = loss_fn([model.preprocess(TEXTS)])  # includes the 'modality' string entry
    assert torch.isfinite(loss)
    loss.backward()
    assert model.transformers_model.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert projection.weight.grad.abs().sum() > 0


def test_head_falls_back_to_config_when_folder_is_gone(model):
    model.transformers_model.config._name_or_path = "/nonexistent/encoder"
    head = masked_lm_head(model)
    assert head(torch.zeros(3, 32)).shape == (3, len(model.tokenizer))


def test_only_the_encoder_is_saved(model, tmp_path):
    torch.manual_seed(0)
    loss_fn = RetroMAELoss(model, PAPER.resolved_mask_ratio, PAPER.resolved_decoder_visible, temperature=0.05)
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=1e-3)
    before = model.encode(TEXTS, convert_to_tensor=True)
    features = [retromae_features(model, TEXTS), retromae_features(model, POSITIVES)]
    model.train()
    for _ in range(2):
        loss = loss_fn(features)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.isfinite(loss)
    assert not any(k.startswith(("decoder", "head")) or ".cls." in k for k in model.state_dict())
    model.save(str(tmp_path / "saved"))
    after = model.encode(TEXTS, convert_to_tensor=True)
    assert not torch.allclose(before, after)  # training changed the encoder
    reloaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert torch.allclose(reloaded.encode(TEXTS, convert_to_tensor=True), after, atol=1e-5)
