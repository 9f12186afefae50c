"""Masked-language-model continued pre-training: the TSDAE paper's MLM baseline.

Token-level masking at 15% (80/10/10), cross-entropy on the selected positions. The MLM head is a
training-only add-on: it lives in the loss module, not in the SentenceTransformer, so the saved
model is the bare encoder (embedded at inference by mean pooling, set up elsewhere), with the head
beside it (tasks/encoders/families.py's MLM_HEAD) for a SPLADE method that starts from it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from torch import nn
from transformers import AutoModelForMaskedLM

from tasks.encoders.families import load_head, masked_lm_part
from tasks.encoders.models import MODEL_LOADING, to_device
from tasks.methods.masking import mask_tokens


def masked_lm_head(model: SentenceTransformer) -> nn.Module:
    """The encoder's MLM head (hidden states [..., H] -> vocab logits [..., V]), its output
    projection tied to the encoder's word embeddings.

    Loaded from the encoder's own folder so a checkpoint that ships a trained head (bert-base) keeps
    it; one without (all-MiniLM-L6-v2) gets a random head, which transformers reports as MISSING.
    """
    encoder = model.transformers_model
    with MODEL_LOADING:
        try:
            mlm = AutoModelForMaskedLM.from_pretrained(encoder.config._name_or_path)
        except (OSError, ValueError):  # folder gone, or a Hub id while offline: same shape, random head
            mlm = AutoModelForMaskedLM.from_config(encoder.config)
    load_head(mlm, encoder.config._name_or_path)  # one an earlier mlm method trained and saved beside the model
    embedding = encoder.get_input_embeddings().weight
    head = masked_lm_part(mlm).to(device=embedding.device, dtype=embedding.dtype)
    # Tie after moving: the head's projection must be the very Parameter the encoder trains.
    mlm.get_output_embeddings().weight = embedding
    return head


def maskable_positions(model: SentenceTransformer, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens that are not special ([CLS], [SEP], [PAD], ...)."""
    special = torch.tensor(model.tokenizer.all_special_ids, device=input_ids.device)
    return attention_mask.bool() & ~torch.isin(input_ids, special)


def encoder_inputs(features: dict) -> dict:
    return {k: features[k] for k in ("attention_mask", "token_type_ids") if k in features}


def selected_ce(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the labelled positions only: the vocab projection is the costliest matmul
    of the step, and most positions carry no label."""
    keep = labels != -100
    return F.cross_entropy(head(hidden[keep]), labels[keep])


class MaskedLMLoss(nn.Module):
    """MLM's loss; MNTP's (tasks/methods/mntp.py) is this with the targets one position on (`shift`), another head,
    mask token and maskable positions."""

    shift = 0  # the token at position i is predicted from the state at i - shift

    def __init__(self, model: SentenceTransformer, mask_ratio: float, head: nn.Module | None = None,
                 mask_id: int | None = None):
        super().__init__()
        self.model = model  # a submodule, so the optimiser over this loss's parameters trains it
        self.head = masked_lm_head(model) if head is None else head
        self.mask_ratio = mask_ratio
        self.mask_id = model.tokenizer.mask_token_id if mask_id is None else mask_id

    def maskable(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return maskable_positions(self.model, input_ids, attention_mask)

    def forward(self, sentence_features: list[dict], labels=None) -> torch.Tensor:
        features = to_device(sentence_features[0], self.model.device)
        ids = features["input_ids"]  # (B, L)
        masked, targets = mask_tokens(ids, self.maskable(ids, features["attention_mask"]), self.mask_ratio,
                                      self.mask_id, len(self.model.tokenizer))
        hidden = self.model.transformers_model(input_ids=masked, **encoder_inputs(features)).last_hidden_state
        return selected_ce(self.head, hidden[:, : hidden.shape[1] - self.shift], targets[:, self.shift :])
