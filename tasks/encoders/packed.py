"""Padding-free training (`train.padding_free`): the encoder's linear layers, which are nearly all
of its compute, run on the batch's real tokens only. A batch of crops is a third padding or more
when each row is padded to the batch's longest.

The batch's rows are packed into one row of their real tokens, with positions restarting at each
row's start, and run through the Hugging Face model itself; only attention needs the rows apart:
`varlen_attention` (registered with transformers' AttentionInterface) lays the packed queries,
keys and values out as the padded batch was, runs SDPA with its key-padding mask, and packs the
result again.
Attention is a few percent of a BERT layer's compute at these lengths, so its padding costs little.
The token states come back padded, so pooling and every loss see what the padded forward gives:
the same numbers in eval mode (tests/tasks/encoders/test_packed.py); in training, dropout draws its
masks over other shapes, so other (equally random) masks.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from tasks.config.base import InputError
from tasks.config.training import AUTO_MIN_HIDDEN

ATTENTION = "embforge_varlen"
# Model types whose Hugging Face encoder takes position_ids and runs attention through the
# AttentionInterface (checked: the same token states as the padded forward).
SUPPORTED = ("bert",)


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, packed_keep=None,
                     packed_at=None, **kwargs):
    """Attention over packed rows laid out as the padded batch was (`packed_keep`: its (rows, length)
    mask of real tokens, `packed_at`: each packed token's place in it, both computed once per batch by
    `packed_token_states`); without them, SDPA as usual (MLM and RetroMAE call the encoder padded)."""
    if packed_at is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    (rows, length), heads, dim = packed_keep.shape, query.shape[1], query.shape[3]

    def padded(packed: torch.Tensor) -> torch.Tensor:  # (1, heads, tokens, dim) -> (rows, heads, length, dim)
        tokens = packed[0].transpose(0, 1)  # (tokens, heads, dim)
        out = tokens.new_zeros(rows * length, heads, dim).index_copy(0, packed_at, tokens)
        return out.view(rows, length, heads, dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value),
                                         attn_mask=packed_keep[:, None, None, :], dropout_p=dropout,
                                         scale=scaling)  # (rows, heads, length, dim)
    # index_select, not [packed_at]: its gradient is an index_add; indexing's (an accumulating index_put) sorts the
    # indices on CUDA
    out = out.transpose(1, 2).reshape(rows * length, heads, dim).index_select(0, packed_at)  # (tokens, heads, dim)
    return out[None], None  # (1, tokens, heads, dim)


AttentionInterface.register(ATTENTION, varlen_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # called unpacked, the model gets SDPA's mask


def filled_tokens(real: int, rows: int, row_tokens: int) -> int:
    """The tokens a compiled encoder's packed row holds: `real` rounded up to a multiple of `row_tokens` a row
    (packed_token_states then stops at the padded batch's slots)."""
    bucket = max(1, row_tokens * rows)
    return -(-real // bucket) * bucket


def packed_token_states(encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor | None = None, row_tokens: int | None = None) -> torch.Tensor:
    """The last hidden states (rows, length, hidden) of `encoder` for a padded batch, computed on
    its real tokens only; zeros at the padding.

    `row_tokens` (a compiled encoder's): the packed row is filled up with padding tokens (`filled_tokens`), so
    the encoder sees a few static shapes. They are masked out as keys, as in the padded forward, so the real
    tokens' states are the same."""
    keep = attention_mask.bool().flatten()  # (rows * length,)
    rows, length = attention_mask.shape
    real = int(keep.sum())  # on CUDA this waits for the device: once per batch
    # (packed,): the real tokens in order, then padding ones; the slice stops at the padded batch's slots
    at = torch.argsort(~keep, stable=True)[:filled_tokens(real, rows, row_tokens) if row_tokens else real]
    positions = torch.arange(length, device=input_ids.device).expand(rows, length).flatten()[at]
    types = torch.zeros_like(positions) if token_type_ids is None else token_type_ids.flatten()[at]
    # Every attention layer gets the layout through the model's keyword arguments.
    hidden = encoder(input_ids=input_ids.flatten()[at][None], position_ids=positions[None], token_type_ids=types[None],
                     packed_keep=keep.view(rows, length), packed_at=at).last_hidden_state[0]  # (packed, hidden)
    return (hidden.new_zeros(rows * length, hidden.shape[-1]).index_copy(0, at[:real], hidden[:real])
            .view(rows, length, -1))


def applies(setting: bool | str, model_type: str, hidden: int, device: torch.device) -> bool:
    """Whether `train.padding_free` = `setting` packs an encoder of `model_type` and width `hidden` on `device`:
    `auto` does for a supported encoder of AUTO_MIN_HIDDEN or wider on a CPU, whose step is then the linear
    layers' arithmetic; on a GPU the step is bound by launching kernels, and the packing's own kernels made a
    BERT-base step slower there (docs/results.md)."""
    if setting == "auto":
        return device.type == "cpu" and model_type in SUPPORTED and hidden >= AUTO_MIN_HIDDEN
    if isinstance(setting, bool):
        return setting
    raise ValueError(f"train.padding_free: {setting!r}, not true, false or auto")


def is_packed(model: SentenceTransformer) -> bool:
    return model[0].auto_model.config._attn_implementation == ATTENTION


def padding_free(model: SentenceTransformer, row_tokens: int | None = None) -> None:
    """Make `model`'s encoder compute on real tokens only (module docstring); `row_tokens`: see
    `packed_token_states`."""
    transformer = model[0]
    encoder = transformer.auto_model
    if encoder.config.model_type not in SUPPORTED:
        raise InputError(f"train.padding_free: supported for {', '.join(SUPPORTED)} encoders, not "
                         f"{encoder.config.model_type!r}; set it to false")
    encoder.set_attn_implementation(ATTENTION)
    # this model's instance only, as a bound method: a deep copy (Contrastive Tension's second encoder) binds
    # to the copy; a closure over `encoder` would run the original's weights in both
    transformer.forward = types.MethodType(packed_forward, transformer)
    transformer.embforge_row_tokens = row_tokens


def packed_forward(transformer, features: dict, **kwargs) -> dict:
    """The sentence-transformers Transformer module's forward, on the batch's real tokens."""
    features["token_embeddings"] = packed_token_states(transformer.auto_model, features["input_ids"],
                                                       features["attention_mask"], features.get("token_type_ids"),
                                                       transformer.embforge_row_tokens)
    return features
