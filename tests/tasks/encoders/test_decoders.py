"""Decoder models as encoders: the tokenizer made to pad and end texts with EOS, the attention switch, last-token
pooling on either padding side, and what a saved bidirectional model loads back as."""

from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer, models
from tokenizers import processors
from transformers import AutoModel, AutoTokenizer, LlamaConfig

from tasks.config.base import InputError
from tasks.encoders import decoders
from tasks.encoders.encode import PooledEncoder, pool
from tasks.encoders.models import load_tokenizer, sentence_model

TEXTS = ["Aspirin reduces the risk of stroke in adults.", "Fever.", "A trial of insulin in children with diabetes."]


def hidden(model, texts):
    features = model.tokenize(texts)
    with torch.no_grad():
        return model[0].auto_model(input_ids=features["input_ids"],
                                   attention_mask=features["attention_mask"]).last_hidden_state


def test_a_decoders_tokenizer_pads_with_eos_and_ends_every_text_with_it(tiny_decoder_dir):
    raw = AutoTokenizer.from_pretrained(Path(tiny_decoder_dir).with_name("model-tokenizer"))
    assert raw.pad_token is None and raw("Fever.")["input_ids"][-1] != raw.eos_token_id  # as the test LLM comes
    tokenizer = load_tokenizer(tiny_decoder_dir)
    batch = tokenizer(TEXTS, padding=True)
    for ids, mask, text in zip(batch["input_ids"], batch["attention_mask"], TEXTS):
        real = [i for i, m in zip(ids, mask) if m]
        assert real == raw(text)["input_ids"] + [raw.eos_token_id]  # the text, then one EOS
    assert tokenizer.pad_token_id == raw.eos_token_id
    again = decoders.ready_tokenizer(tokenizer, LlamaConfig())  # applying it again changes nothing
    assert again("Fever.")["input_ids"] == tokenizer("Fever.")["input_ids"]


def test_the_tokens_a_tokenizer_puts_first_are_kept(tiny_decoder_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_decoder_dir)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)])  # Llama 3's way: BOS first
    ids = decoders.ready_tokenizer(tokenizer, LlamaConfig())("Fever.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id and ids.count(ids[-1]) == 1


def test_an_encoders_tokenizer_is_left_as_it_is(tiny_dir):
    assert load_tokenizer(tiny_dir)("Fever.")["input_ids"] == AutoTokenizer.from_pretrained(tiny_dir)("Fever.")[
        "input_ids"]


def test_bidirectional_attention_changes_the_first_tokens_state_and_the_causal_default_does_not(tiny_decoder_dir):
    plain = AutoModel.from_pretrained(tiny_decoder_dir).eval()  # transformers' own model: causal
    causal = sentence_model(tiny_decoder_dir, 64).eval()
    bidirectional = sentence_model(tiny_decoder_dir, 64, bidirectional=True).eval()
    features = causal.tokenize(TEXTS)
    with torch.no_grad():
        own = plain(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).last_hidden_state
    torch.testing.assert_close(hidden(causal, TEXTS), own)
    # The first token sees only itself under causal attention: the rest of the text changes it only when
    # bidirectional; the same holds without padding (one text), where no mask is built at all.
    for texts in (TEXTS, TEXTS[:1]):
        assert (hidden(bidirectional, texts)[:, 0] - hidden(causal, texts)[:, 0]).abs().amax(-1).min() > 1e-3
    assert not bidirectional[0].auto_model.config.is_causal
    assert all(not m.is_causal for m in decoders.attention_modules(bidirectional[0].auto_model))


def test_a_saved_bidirectional_model_loads_back_bidirectional_everywhere(tiny_decoder_dir, tmp_path):
    model = sentence_model(tiny_decoder_dir, 64, pooling="sep", bidirectional=True).eval()
    model.save(str(tmp_path / "saved"))
    vectors = model.encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "saved"), device="cpu").encode(TEXTS), vectors,
                               atol=1e-5)
    np.testing.assert_allclose(PooledEncoder(str(tmp_path / "saved"), "cpu", "sep").encode(TEXTS, 64), vectors,
                               atol=1e-5)
    np.testing.assert_allclose(hidden(sentence_model(str(tmp_path / "saved"), 64).eval(), TEXTS),
                               hidden(model, TEXTS), atol=1e-5)


def test_bidirectional_on_an_encoder_is_an_input_error(tiny_dir):
    with pytest.raises(InputError, match="bert encoder: bidirectional attention"):
        sentence_model(tiny_dir, 64, bidirectional=True)


def test_dropout_is_set_in_the_config_at_load(tiny_decoder_dir, tiny_dir):
    assert sentence_model(tiny_decoder_dir, 64, dropout=0.3)[0].auto_model.config.attention_dropout == 0.3
    config = sentence_model(tiny_dir, 64, dropout=0.2)[0].auto_model.config
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0.2


@pytest.mark.parametrize("side", ["right", "left"])
def test_last_token_pooling_picks_the_last_real_token_on_either_padding_side(tiny_decoder_dir, side):
    tokenizer = load_tokenizer(tiny_decoder_dir)
    tokenizer.padding_side = side
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    states = torch.arange(batch["input_ids"].numel() * 2, dtype=torch.float32).view(*batch["input_ids"].shape, 2)
    picked = pool(states, batch["attention_mask"], "sep")
    lengths = batch["attention_mask"].sum(1)
    last = lengths - 1 if side == "right" else torch.full_like(lengths, batch["input_ids"].shape[1] - 1)
    torch.testing.assert_close(picked, states[torch.arange(len(TEXTS)), last])
    assert (batch["input_ids"][torch.arange(len(TEXTS)), last] == tokenizer.eos_token_id).all()  # the EOS
    st_picked = models.Pooling(2, "lasttoken")({"token_embeddings": states, "attention_mask": batch["attention_mask"]})
    torch.testing.assert_close(st_picked["sentence_embedding"], picked)  # what training and the export use
