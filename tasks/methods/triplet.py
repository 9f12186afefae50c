"""SemCSE's in-batch triplet loss (docs/methods.md §5).

Anchor i is a summary of document i, its positive p_i another summary of the same document, and
the positives p_j of every other pair in the batch are its negatives: B − 1 triplets per anchor,
hinge relu(‖a_i − p_i‖ − ‖a_i − p_j‖ + margin) in Euclidean distance, averaged over all B(B − 1)
of them. A weak L2 penalty on the anchor embeddings (weight 1/250) keeps their norms in check:
scaling every embedding up would otherwise meet the fixed margin by size alone. Embeddings are
raw, not normalised: the distances are Euclidean, not cosine.
"""

from __future__ import annotations

import torch
from sentence_transformers import SentenceTransformer
from torch import nn

from tasks.methods.distributed import Gather, no_gather

# Inside the sqrt: d/dx √x is infinite at 0, so an anchor identical to a positive (the "same
# input" ablation without dropout) would turn the backward pass into NaN. Shifts distances by 1e-6.
SQRT_EPS = 1e-12


def pairwise_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Not torch.cdist: past 25 rows it switches to the ‖a‖² − 2a·b + ‖b‖² form, which in float32
    # gave identical rows distances up to 0.016 instead of 0 (measured at dim 384). Broadcasting
    # is exact and costs a B × B × dim tensor, small at training batch sizes.
    return ((a[:, None, :] - b[None, :, :]).pow(2).sum(-1) + SQRT_EPS).sqrt()


def triplet_in_batch(anchors: torch.Tensor, positives: torch.Tensor, margin: float,
                     l2_weight: float) -> torch.Tensor:
    if len(anchors) < 2:
        raise ValueError(f"the in-batch triplet loss needs at least 2 pairs per batch, got {len(anchors)}")
    d = pairwise_distances(anchors, positives)
    hinge = torch.relu(d.diagonal()[:, None] - d + margin)
    # The diagonal (j = i) would use an anchor's own positive as its negative: a constant `margin`.
    off_diagonal = ~torch.eye(len(anchors), dtype=torch.bool, device=anchors.device)
    return hinge[off_diagonal].mean() + l2_weight * anchors.pow(2).sum(-1).mean()


class TripletInBatchLoss(nn.Module):
    """sentence-transformers-style loss: `forward(sentence_features, labels)` with
    sentence_features = [anchors, positives]; labels are unused. `gather`, `embed` and `score`: as in
    InfoNCELoss."""

    def __init__(self, model: SentenceTransformer, margin: float = 1.0, l2_weight: float = 1 / 250,
                 gather: Gather = no_gather):
        super().__init__()
        self.model = model
        self.margin = margin
        self.l2_weight = l2_weight
        self.gather = gather

    def embed(self, sentence_features: list[dict]) -> list[torch.Tensor]:
        return [self.model(f)["sentence_embedding"] for f in sentence_features]

    def score(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        anchors, positives = (self.gather(e) for e in embeddings)
        return triplet_in_batch(anchors, positives, self.margin, self.l2_weight)

    def forward(self, sentence_features: list[dict], labels=None) -> torch.Tensor:
        return self.score(self.embed(sentence_features))
