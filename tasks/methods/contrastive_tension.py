"""Contrastive Tension with in-batch negatives (docs/methods.md), whose rows are gathered from
every process: sentence-transformers' `ContrastiveTensionLossInBatchNegatives` with a `gather`."""

from __future__ import annotations

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import ContrastiveTensionLossInBatchNegatives

from tasks.methods.distributed import Gather, no_gather


class GatheredContrastiveTensionLoss(ContrastiveTensionLossInBatchNegatives):
    def __init__(self, model: SentenceTransformer, scale: float,
                 gather: Gather = no_gather):
        super().__init__(model, scale=scale)
        self.gather = gather

    def forward(self, sentence_features: list[dict], labels=None) -> torch.Tensor:
        features = sentence_features[0]  # both copies of the encoder embed the same sentences
        a = self.gather(self.model1(features)["sentence_embedding"])  # (B, D), B over every process
        b = self.gather(self.model2(features)["sentence_embedding"])
        scores = self.similarity_fct(a, b) * self.logit_scale.exp()
        labels = torch.arange(len(scores), dtype=torch.long, device=scores.device)
        return (self.cross_entropy_loss(scores, labels) + self.cross_entropy_loss(scores.t(), labels)) / 2
