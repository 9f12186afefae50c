"""Padding-free training (`train.padding_free`): the encoder's linear layers, which are nearly all
of its compute, run on the batch's real tokens only. A batch of crops is a third padding or more
when each row is padded to the batch's longest.

The batch's rows are packed into one row of their real tokens, with positions restarting at each
row's start, and run through the Hugging Face model itself; only attention needs the rows apart:
`varlen_attention` (registered with transformers' AttentionInterface) lays the packed queries,
keys and values out padded, runs SDPA with the key-padding mask, and packs the result again.
Attention is a few percent of a BERT layer's compute at these lengths, so its padding costs little.
The token states come back padded, so pooling and every loss see what the padded forward gives:
the same numbers in eval mode (tests/tasks/encoders/test_packed.py); in training, dropout draws its
masks over other shapes, so other (equally random) masks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from tasks.config.base import InputError

ATTENTION = "embforge_varlen"
# Model types whose Hugging Face encoder takes position_ids and runs attention through the
# AttentionInterface (checked: the same token states as the padded forward).
SUPPORTED = ("bert",)


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """Attention over packed rows (`cu_seq_lens_q`: where each starts); without them, SDPA as usual
    (the model called unpacked: MLM and RetroMAE call the encoder themselves)."""
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    lengths = cu_seq_lens_q.diff()
    rows, longest, heads, dim = len(lengths), int(max_length_q), query.shape[1], query.shape[3]
    keep = torch.arange(longest, device=query.device) < lengths[:, None]  # (rows, longest)
    at = keep.flatten().nonzero().squeeze(1)  # (tokens,): each packed token's place in the padded layout

    def padded(packed: torch.Tensor) -> torch.Tensor:  # (1, heads, tokens, dim) -> (rows, heads, longest, dim)
        tokens = packed[0].transpose(0, 1)  # (tokens, heads, dim)
        out = tokens.new_zeros(rows * longest, heads, dim).index_copy(0, at, tokens)
        return out.view(rows, longest, heads, dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value), attn_mask=keep[:, None, None, :],
                                         dropout_p=dropout, scale=scaling)  # (rows, heads, longest, dim)
    return out.transpose(1, 2).reshape(rows * longest, heads, dim)[at][None], None  # (1, tokens, heads, dim)


AttentionInterface.register(ATTENTION, varlen_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # called unpacked, the model gets SDPA's mask


def packed_token_states(encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The last hidden states (rows, length, hidden) of `encoder` for a padded batch, computed on
    its real tokens only; zeros at the padding."""
    keep = attention_mask.bool()  # (rows, length)
    rows, length = keep.shape
    at = keep.flatten().nonzero().squeeze(1)  # (tokens,)
    lengths = keep.sum(1)
    starts = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # (rows + 1,)
    positions = torch.arange(length, device=input_ids.device).expand(rows, length).flatten()[at]
    types = torch.zeros_like(positions) if token_type_ids is None else token_type_ids.flatten()[at]
    longest = int(lengths.max())
    hidden = encoder(input_ids=input_ids.flatten()[at][None], position_ids=positions[None],
                     token_type_ids=types[None], cu_seq_lens_q=starts, cu_seq_lens_k=starts,
                     max_length_q=longest, max_length_k=longest).last_hidden_state[0]  # (tokens, hidden)
    return hidden.new_zeros(rows * length, hidden.shape[-1]).index_copy(0, at, hidden).view(rows, length, -1)


def padding_free(model: SentenceTransformer) -> None:
    """Make `model`'s encoder compute on real tokens only (module docstring)."""
    transformer = model[0]
    encoder = transformer.auto_model
    if encoder.config.model_type not in SUPPORTED:
        raise InputError(f"train.padding_free: supported for {', '.join(SUPPORTED)} encoders, not "
                         f"{encoder.config.model_type!r}; set it to false")
    encoder.set_attn_implementation(ATTENTION)

    def forward(features: dict, **kwargs) -> dict:
        features["token_embeddings"] = packed_token_states(encoder, features["input_ids"], features["attention_mask"],
                                                           features.get("token_type_ids"))
        return features

    transformer.forward = forward  # this model's instance only
