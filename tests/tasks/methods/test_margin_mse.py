"""gpl_margin: GPL's MarginMSE, the student's dot-product margin against the cross-encoder's, through
the objective and the training loop (which hands the loss its labels)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.config.training import TrainConfig
from tasks.encoders.models import sentence_model
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model
from tests.helpers import no_dropout

ROWS = [("what causes fever", "Fever is caused by infection.", "Bones heal in weeks.", 6.5),
        ("bone healing time", "Fractures heal in six weeks.", "Fever follows infection.", 4.0),
        ("insulin role", "Insulin lowers blood glucose.", "The heart pumps blood.", -1.5),
        ("heart function", "The heart pumps blood around the body.", "Insulin acts on the liver.", 0.25)]


def by_hand(model, rows) -> torch.Tensor:
    """mean((q . p - q . n - margin)^2) with the model's sentence vectors."""
    with torch.no_grad():
        q, p, n = (model.encode([r[i] for r in rows], convert_to_tensor=True) for i in range(3))
    margins = torch.tensor([r[3] for r in rows])
    return (((q * p).sum(1) - (q * n).sum(1) - margins) ** 2).mean()


def test_the_loss_is_the_mean_squared_error_of_the_dot_product_margins(tiny_dir):
    model = no_dropout(sentence_model(tiny_dir, 64))
    objective = build_objective(model, "gpl_margin", TrainConfig(), None, None)
    assert objective.chance is None  # a model with one vector for every text predicts margin 0: no chance level
    labels = objective.labels(ROWS)
    assert labels.tolist() == [r[3] for r in ROWS]
    loss = objective.loss(objective.collate(ROWS), labels)
    assert loss.item() == pytest.approx(by_hand(model, ROWS).item(), rel=1e-5)


def test_the_training_loop_hands_the_loss_its_margins(tiny_dir, tmp_path):
    rows = ROWS * 2
    pq.write_table(pa.table({"epoch": pa.array([0] * len(rows), pa.int32()), "doc_id": [str(i) for i in range(8)],
                             "anchor": [r[0] for r in rows], "positive": [r[1] for r in rows],
                             "negative": [r[2] for r in rows], "margin": pa.array([r[3] for r in rows], pa.float32())}),
                   tmp_path / "pairs.parquet")
    model = no_dropout(sentence_model(tiny_dir, 64))
    expected = by_hand(model, ROWS).item()  # the first batch's loss, before any step
    cfg = TrainConfig(batch_size=4, lr=1e-3, schedule="constant", checkpoint_every=100)
    with pq.ParquetFile(tmp_path / "pairs.parquet") as pairs:
        history = train_model(build_objective(model, "gpl_margin", cfg, None, None), PairBatches(pairs, 4), cfg,
                              Checkpoints(tmp_path / "ckpt"))
    assert len(history) == 2 and history[0].loss == pytest.approx(expected, rel=1e-4)
    assert history[1].loss < history[0].loss  # the same rows again, after a step towards the margins
