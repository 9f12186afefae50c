"""SemCSE's in-batch triplet loss: hand computations, the triplets it forms, and its gradients."""

import math

import pytest
import torch

from tasks.encoders.models import sentence_model
from tasks.methods.triplet import TripletInBatchLoss, triplet_in_batch


def test_triplet_loss_equals_hand_computation():
    anchors = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    positives = torch.tensor([[1.0, 0.0], [2.0, 0.5], [0.0, 0.0]])
    # d(a_i, p_i): 1, 0.5, 2.  Hinge d(a_i, p_i) − d(a_i, p_j) + 1 for the six pairs j ≠ i:
    h01 = max(0.0, 1 - math.sqrt(4.25) + 1)  # d(a0, p1) = √(4 + 0.25): inactive
    h02 = 1 - 0 + 1  # p2 sits on a0
    h10 = 0.5 - 1 + 1
    h12 = max(0.0, 0.5 - 2 + 1)  # inactive
    h20 = 2 - math.sqrt(5) + 1  # d(a2, p0) = √(1 + 4)
    h21 = 2 - 2.5 + 1  # d(a2, p1) = √(4 + 2.25)
    assert h01 == 0 and h12 == 0
    hinge = (h01 + h02 + h10 + h12 + h20 + h21) / 6  # B − 1 = 2 triplets per anchor
    l2 = (0 + 4 + 4) / 3 / 250  # anchors only: the positives' norms do not count
    assert triplet_in_batch(anchors, positives, 1.0, 1 / 250).item() == pytest.approx(hinge + l2, abs=1e-5)


def test_negatives_are_the_other_pairs_positives():
    torch.manual_seed(0)
    a, p = torch.randn(5, 4), torch.randn(5, 4)
    # Every anchor i against every other pair's positive j: 5 × 4 triplets, averaged.
    triplets = [max(0.0, (a[i] - p[i]).norm().item() - (a[i] - p[j]).norm().item() + 0.7)
                for i in range(5) for j in range(5) if j != i]
    assert len(triplets) == 20
    assert triplet_in_batch(a, p, 0.7, 0.0).item() == pytest.approx(sum(triplets) / 20, rel=1e-5)


def test_diagonal_is_not_a_triplet_and_l2_penalty_by_hand():
    # Each anchor on its own positive, the other positive far off: every real triplet is satisfied.
    # Counting j = i would add relu(0 − 0 + margin) = 1 for each anchor (0.5 on average here).
    a = torch.tensor([[3.0, 4.0], [0.0, -2.0]])
    l2 = (25 + 4) / 2 / 250
    assert triplet_in_batch(a, a.clone(), 1.0, 1 / 250).item() == pytest.approx(l2, abs=1e-5)


def test_moving_one_positive_away_changes_only_its_triplets():
    a = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    p = torch.tensor([[1.0, 0.0], [2.0, 0.5], [0.0, 0.0]])
    far = p.clone()
    far[2] = torch.tensor([100.0, 100.0])
    # p2 stops being a close negative of a0 (h02: 2 → 0) and, as a2's own positive, now lies
    # d22 away, so a2's two triplets grow by d22 − 2. h01, h10 and h12 do not involve p2.
    d22 = math.hypot(100, 98)
    h20, h21 = d22 - math.sqrt(5) + 1, d22 - 2.5 + 1
    expected = (0 + 0 + 0.5 + 0 + h20 + h21) / 6
    assert triplet_in_batch(a, far, 1.0, 0.0).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("anchors", [torch.zeros(3, 4), torch.randn(3, 4)], ids=["all-equal", "random"])
def test_gradients_are_finite_when_anchors_equal_positives(anchors):
    # The "same input" ablation without dropout: every d(a_i, p_i) is exactly 0, and with all-equal
    # rows every distance is 0 and every hinge is active.
    a = anchors.clone().requires_grad_(True)
    p = anchors.clone().requires_grad_(True)
    loss = triplet_in_batch(a, p, 1.0, 1 / 250)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(a.grad).all() and torch.isfinite(p.grad).all()


def test_a_single_pair_is_refused():
    with pytest.raises(ValueError, match="at least 2 pairs"):
        triplet_in_batch(torch.zeros(1, 2), torch.ones(1, 2), 1.0, 0.0)


def test_module_runs_on_a_tiny_sentence_transformer(tiny_dir):
    model = sentence_model(tiny_dir, 32)
    loss = TripletInBatchLoss(model).eval()
    anchors = ["a summary of the first paper", "the second paper in brief", "third summary"]
    positives = ["another summary of paper one", "paper two, summarised again", "third, once more"]
    value = loss([model.preprocess(anchors), model.preprocess(positives)], None)
    assert value.dim() == 0 and torch.isfinite(value)
    with torch.no_grad():
        a = model(model.preprocess(anchors))["sentence_embedding"]
        p = model(model.preprocess(positives))["sentence_embedding"]
    assert value.item() == pytest.approx(triplet_in_batch(a, p, 1.0, 1 / 250).item(), rel=1e-5)
    value.backward()
    grads = [q.grad for q in model.parameters() if q.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(g is None or torch.isfinite(g).all() for g in grads)
