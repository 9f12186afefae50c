"""InfoNCE / NT-Xent, one direction, in-batch negatives (docs/methods.md §1, §2).

For anchor i the logits are cos(a_i, p_j) / τ over every positive j in the batch (and every hard
negative, when the rows carry one) and the target is j = i. With τ = 0.05 this is
sentence-transformers' MultipleNegativesRankingLoss(scale=20), with or without negatives (the
tests check both). We keep our own module because the recipes need two things MNRL lacks:
SimCSE's single forward pass over both views, and a projection head used only in training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from torch import nn

from tasks.methods.distributed import Gather, no_gather


def info_nce(anchors: torch.Tensor, candidates: torch.Tensor, temperature: float) -> torch.Tensor:
    """`candidates`: anchor i's positive in row i, then any negatives (B' >= B rows)."""
    logits = F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T / temperature  # (B, B')
    return F.cross_entropy(logits, torch.arange(len(anchors), device=anchors.device))


class InfoNCELoss(nn.Module):
    """sentence-transformers-style loss: `forward(sentence_features, labels)`.

    sentence_features is [anchors, positives], or a single batch of 2B rows (anchors then
    positives) when `one_pass`: SimCSE's way, where one forward pass draws different dropout
    masks for the two copies of each sentence. `gather` collects the rows of every process
    (tasks/methods/distributed.py) before they are compared; `embed` and `score` are the two halves
    that a cached (GradCache) step runs apart.
    """

    def __init__(self, model: SentenceTransformer, temperature: float, head: str = "none", one_pass: bool = False,
                 gather: Gather = no_gather):
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.one_pass = one_pass
        self.gather = gather
        dim = model.get_embedding_dimension()
        # SimCSE's MLP (dense + tanh) sits on top during training only; it is not saved with the model.
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) if head == "mlp" else nn.Identity()

    def embed(self, sentence_features: list[dict]) -> list[torch.Tensor]:
        return [self.head(self.model(f)["sentence_embedding"]) for f in sentence_features]

    def score(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        if self.one_pass:
            anchors, positives = embeddings[0].chunk(2)  # (2B, D) -> 2 x (B, D)
            candidates = [positives]
        else:
            anchors, *candidates = embeddings  # positives, then any hard negatives: (B, D) each
        # Each column gathered on its own, so the positives stay first and in the anchors' order.
        candidates = torch.cat([self.gather(c) for c in candidates])  # (B * columns, D)
        return info_nce(self.gather(anchors), candidates, self.temperature)

    def forward(self, sentence_features: list[dict], labels=None) -> torch.Tensor:
        return self.score(self.embed(sentence_features))
