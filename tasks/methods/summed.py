"""A loss that returns its terms by name as their sum: the training loop backpropagates and logs one number."""

from __future__ import annotations

import torch
from torch import nn


class SummedLoss(nn.Module):
    """`loss` (sentence-transformers' CSR or SPLADE loss: InfoNCE and its reconstruction or regulariser terms, each by
    name) summed. Its parameters and state are the wrapped loss's, under `loss.`."""

    def __init__(self, loss: nn.Module):
        super().__init__()
        self.loss = loss

    def forward(self, sentence_features: list[dict], labels: torch.Tensor | None = None) -> torch.Tensor:
        return sum(self.loss(sentence_features, labels).values())
