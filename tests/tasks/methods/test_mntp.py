"""MNTP (LLM2Vec's masked next-token prediction): the loss against one computed by hand, what is never masked,
the LM head, and a decoder recipe on an encoder."""

import math

import pytest
import torch
import torch.nn.functional as F

from tasks.config.base import InputError
from tasks.config.training import TrainConfig, bidirectional_for
from tasks.encoders.inputs import features
from tasks.encoders.models import sentence_model
from tasks.methods.masking import mask_tokens
from tasks.methods.mntp import BLANK, MaskedNextTokenLoss, mask_token_id
from tasks.methods.objectives import build_objective

TEXTS = ["Aspirin reduces the risk of stroke in adults.", "Fever in infants.",
         "A randomised trial of insulin in children with type 1 diabetes and their parents."]


@pytest.fixture
def decoder(tiny_decoder_dir):
    return sentence_model(tiny_decoder_dir, 64, bidirectional=True)


def test_the_loss_is_next_token_cross_entropy_at_the_masked_positions(decoder):
    loss_fn = MaskedNextTokenLoss(decoder, 0.3)
    batch = features(decoder, TEXTS)
    torch.manual_seed(7)
    loss = loss_fn([batch])

    # By hand: the same draws, every position's logits through the tied word embeddings, then the mean
    # cross-entropy of each masked token from the logits one position before it.
    ids, attention = batch["input_ids"], batch["attention_mask"]
    special = torch.isin(ids, torch.tensor(decoder.tokenizer.all_special_ids))
    maskable = attention.bool() & ~special
    maskable[:, 0] = False  # nothing before the first token to predict it from
    torch.manual_seed(7)
    masked, labels = mask_tokens(ids, maskable, 0.3, mask_token_id(decoder.tokenizer), len(decoder.tokenizer))
    states = decoder.transformers_model(input_ids=masked, attention_mask=attention).last_hidden_state
    logits = states @ decoder.transformers_model.get_input_embeddings().weight.T  # (B, L, V)
    terms = [F.cross_entropy(logits[b, i - 1], labels[b, i], reduction="sum")
             for b in range(len(TEXTS)) for i in range(ids.shape[1]) if labels[b, i] != -100]
    assert len(terms) >= len(TEXTS)
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    assert abs(loss.item() - math.log(len(decoder.tokenizer))) < 1.0  # a random model: about chance


def test_first_tokens_and_eos_are_never_masked_and_blank_is_the_mask(decoder):
    loss_fn = MaskedNextTokenLoss(decoder, 0.9)
    assert loss_fn.mask_id == decoder.tokenizer.convert_tokens_to_ids(BLANK) != decoder.tokenizer.unk_token_id
    batch = features(decoder, TEXTS)
    maskable = loss_fn.maskable(batch["input_ids"], batch["attention_mask"])
    assert not maskable[:, 0].any()
    assert not maskable[batch["input_ids"] == decoder.tokenizer.eos_token_id].any()  # the appended EOS and padding
    assert maskable[:, 1].all()
    left = torch.tensor([[0, 0, 1, 1, 1]])  # left padding: the first real token is never masked either
    assert loss_fn.maskable(torch.tensor([[1, 1, 70, 71, 72]]), left).tolist() == [[False] * 3 + [True] * 2]


def test_the_lm_head_is_the_word_embeddings_and_the_decoder_learns(decoder):
    objective = build_objective(decoder, "mntp", TrainConfig(), 0.2, None)
    assert objective.loss.head.weight is decoder.transformers_model.get_input_embeddings().weight
    torch.manual_seed(0)
    objective.loss(objective.collate([(t, t) for t in TEXTS])).backward()
    grads = [p.grad for p in decoder.transformers_model.layers.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_a_decoder_recipe_on_an_encoder_is_an_input_error(tiny_dir):
    with pytest.raises(InputError, match="applies to decoder models"):
        sentence_model(tiny_dir, 64, bidirectional=bidirectional_for("mntp", TrainConfig()))
