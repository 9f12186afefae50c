"""Masked next-token prediction (MNTP): LLM2Vec's step 2, which teaches a decoder made bidirectional to use the
tokens after a position.

Like MLM, a share of the tokens is corrupted (80% mask / 10% random / 10% kept), but the token at position i is
predicted from the hidden state at position i-1, through the decoder's own LM head: the head was trained to
predict the next token from there. Decoders have no mask token; LLM2Vec masks with "_" (its `blank` type). The LM
head is a training-only add-on living in the loss, as MLM's: the saved model is the bare decoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from sentence_transformers import SentenceTransformer
from torch import nn

from tasks.methods.mlm import MaskedLMLoss

BLANK = "_"  # the mask token of a tokenizer without one (LLM2Vec's)


def mask_token_id(tokenizer) -> int:
    """The tokenizer's mask token, else "_" as one token, else its padding token."""
    if tokenizer.mask_token_id is not None:
        return tokenizer.mask_token_id
    blank = tokenizer.convert_tokens_to_ids(BLANK)
    return blank if blank is not None and blank != tokenizer.unk_token_id else tokenizer.pad_token_id


def saved_lm_head(folder: Path) -> torch.Tensor | None:
    """The `lm_head.weight` a causal-LM checkpoint holds (safetensors, one file or sharded), or None."""
    index = folder / "model.safetensors.index.json"
    files = ({json.loads(index.read_text())["weight_map"].get("lm_head.weight")} - {None} if index.is_file()
             else {"model.safetensors"})
    for name in files:
        if (folder / name).is_file():
            with safe_open(str(folder / name), "pt") as f:
                if "lm_head.weight" in f.keys():
                    return f.get_tensor("lm_head.weight")
    return None


def lm_head(model: SentenceTransformer) -> nn.Linear:
    """The decoder's LM head (hidden states [..., H] -> vocabulary logits [..., V]): the word embeddings themselves
    when the model ties them (the very Parameter the decoder trains), else the checkpoint's head, else a random one
    (a checkpoint saved without it)."""
    decoder = model.transformers_model
    embedding = decoder.get_input_embeddings().weight  # (V, H)
    head = nn.Linear(embedding.shape[1], embedding.shape[0], bias=False, device=embedding.device,
                     dtype=embedding.dtype)
    if decoder.config.tie_word_embeddings:
        head.weight = embedding
    elif (saved := saved_lm_head(Path(decoder.config._name_or_path))) is not None:
        head.weight.data.copy_(saved)
    return head


class MaskedNextTokenLoss(MaskedLMLoss):
    shift = 1  # position i-1's state predicts token i

    def __init__(self, model: SentenceTransformer, mask_ratio: float):
        super().__init__(model, mask_ratio, lm_head(model), mask_token_id(model.tokenizer))

    def maskable(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # A token is predicted from the position before it, so a text's first token (and with left padding, the
        # first real one) has nothing to be predicted from: never masked.
        after_real = torch.zeros_like(attention_mask, dtype=torch.bool)
        after_real[:, 1:] = attention_mask[:, :-1].bool()
        return super().maskable(input_ids, attention_mask) & after_real
