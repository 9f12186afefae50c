"""TSDAE (docs/methods.md §3): sentence-transformers' decoder loss. Its input, a crop with words deleted, is
the noise view's (tasks/views/noise.py), drawn by the pairs stage.

The loss is sentence-transformers' `DenoisingAutoEncoderLoss` with tied encoder and decoder: a
causal LM copy of the encoder with new cross-attention layers whose only memory is the pooled
sentence vector (a 1-token sequence), so the decoder never sees the input tokens.
"""

from __future__ import annotations

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss


def tsdae_loss(model: SentenceTransformer) -> DenoisingAutoEncoderLoss:
    """Decoder tied to `model`: it is built from the folder the encoder was loaded from."""
    return DenoisingAutoEncoderLoss(model, tie_encoder_decoder=True)
