import math

import torch

from tasks.methods.infonce import info_nce


def test_info_nce_equals_hand_computation():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    positives = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    tau = 0.5
    # cosines: a0·p0 = 1, a0·p1 = 1/√2, a1·p0 = 0, a1·p1 = 1/√2
    r = 1 / math.sqrt(2)
    loss0 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(r / tau)))
    loss1 = -math.log(math.exp(r / tau) / (math.exp(0) + math.exp(r / tau)))
    assert math.isclose(info_nce(anchors, positives, tau).item(), (loss0 + loss1) / 2, rel_tol=1e-6)


def test_info_nce_matches_sentence_transformers_mnrl_scale_20():
    from sentence_transformers.util import cos_sim

    torch.manual_seed(0)
    a, p = torch.randn(8, 16), torch.randn(8, 16)
    # MultipleNegativesRankingLoss(scale=20) computes exactly this from its embeddings.
    expected = torch.nn.functional.cross_entropy(cos_sim(a, p) * 20, torch.arange(8))
    assert torch.allclose(info_nce(a, p, 0.05), expected, atol=1e-6)


def test_info_nce_with_hard_negatives_matches_sentence_transformers_mnrl_on_the_same_model(tiny_dir):
    """GPL's loss (query, passage, mined negative): our InfoNCELoss against sentence-transformers' own
    MultipleNegativesRankingLoss(scale=20) over (anchor, positive, negative) columns, one model."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from tasks.methods.infonce import InfoNCELoss
    from tasks.methods.objectives import anchors_and_positives

    model = SentenceTransformer(tiny_dir, device="cpu").eval()  # no dropout: both see the same vectors
    rows = [(f"query {i}", f"passage {i} about topic {i % 3}", f"another passage {i + 5}") for i in range(6)]
    features = anchors_and_positives(model)(rows)
    assert len(features) == 3  # anchors, positives, negatives
    ours, theirs = InfoNCELoss(model, 0.05)(features), MultipleNegativesRankingLoss(model, scale=20)(features, None)
    assert torch.allclose(ours, theirs, atol=1e-5)
    # The negatives count: without them the loss is a different (in-batch only) one.
    assert not torch.allclose(InfoNCELoss(model, 0.05)(features[:2]), ours, atol=1e-4)
