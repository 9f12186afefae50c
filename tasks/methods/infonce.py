"""InfoNCE / NT-Xent, one direction, in-batch negatives (methods.md §1).

For anchor i the logits are cos(a_i, p_j) / τ over every positive j in the batch and the target
is j = i. With τ = 0.05 this is sentence-transformers' MultipleNegativesRankingLoss(scale=20).
"""

import torch
import torch.nn.functional as F


def info_nce(anchors: torch.Tensor, positives: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = F.normalize(anchors, dim=-1) @ F.normalize(positives, dim=-1).T / temperature
    return F.cross_entropy(logits, torch.arange(len(anchors), device=anchors.device))
