import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from sentence_transformers import MultiVectorEncoder
from sentence_transformers.base.modules import Normalize
from sentence_transformers.base.modules.dense import Dense
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

from tasks.config.base import InputError
from tasks.config.families import FAMILIES
from tasks.config.splits import KnnConfig
from tasks.config.training import MethodConfig, MultiVectorSettings, TrainConfig
from tasks.encoders import encode, families
from tasks.encoders.models import sentence_model
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model
from tasks.tokens import TOKENS, TokensInputs, TokensJob
from tasks.train import TRAIN, TrainInputs, TrainJob, frozen_objective, knn_curve, training_model
from tests.helpers import REPO, model_tokens_file, straight_and_resumed

CFG = TrainConfig(batch_size=4, lr=1e-3, max_length=32, checkpoint_every=2, warmup_ratio=0.1)
SETTINGS = MultiVectorSettings(dim=16)
PAIRS = [[(f"what is topic {i % 3}, case {i}?", f"doc {i}: the second part, topic {i % 3}.") for i in range(e, e + 20)]
         for e in range(2)]  # 2 epochs x 5 batches
METHOD = MethodConfig(name="crops-mv", recipe="crops", family="multi_vector", multi_vector=SETTINGS)


def multi_vector(tiny_dir, seed=0):
    return families.multi_vector_model(sentence_model(tiny_dir, CFG.max_length), SETTINGS, seed)


def test_maxsim_of_the_loss_is_each_query_tokens_best_match_summed(tiny_dir):
    objective = build_objective(multi_vector(tiny_dir), "crops", CFG, None, None, family=SETTINGS)
    assert objective.loss.similarity_fct is None  # the loss scores by the model's own similarity: MaxSim
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (2 tokens, dim 2)
    documents = [torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]])]
    scores = objective.loss.model.similarity([query], documents)
    # document 1: token 1 best matches [1, 0] (1.0), token 2 best matches [0.6, 0.8] (0.8); document 2: 0 + 1
    assert scores.tolist() == [[pytest.approx(1.8), pytest.approx(1.0)]]


def test_the_projection_is_drawn_from_the_seed_alone(tiny_dir):
    torch.manual_seed(1)
    a = multi_vector(tiny_dir)[1].linear.weight
    torch.manual_seed(2)
    b = multi_vector(tiny_dir)[1].linear.weight
    assert a.shape == (SETTINGS.dim, 32) and torch.equal(a, b)
    assert not torch.equal(a, multi_vector(tiny_dir, seed=1)[1].linear.weight)


def test_a_multi_vector_model_resumes_after_a_kill_to_the_same_weights(tiny_dir, tmp_path):
    def run(folder, on_step=None):
        model = multi_vector(tiny_dir)
        objective = build_objective(model, "crops", CFG, None, None, family=SETTINGS)
        history = train_model(objective, PairBatches(model_tokens_file(model, PAIRS), CFG.batch_size), CFG,
                              Checkpoints(folder), on_step=on_step)
        return model, history

    (straight, full), (resumed, rest) = straight_and_resumed(run, tmp_path / "a", tmp_path / "b")
    assert [h.loss for h in rest] == [h.loss for h in full] and len(full) == 10
    a, b, untrained = straight.state_dict(), resumed.state_dict(), multi_vector(tiny_dir).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["1.linear.weight"], untrained["1.linear.weight"])  # the projection trained too


def test_the_train_stage_saves_a_multi_vector_model_that_sentence_transformers_loads(demo, tiny_dir):
    store, pairs = demo
    ref = pairs("crops")
    cfg = CFG.model_copy(update={"checkpoint_every": 100, "max_steps": 6})
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, METHOD, cfg), TokensInputs(pairs=ref))
    job = TrainJob.for_method(tiny_dir, METHOD, cfg, None)
    inputs = TrainInputs(pairs=ref, tokens=tokens)
    trained = TRAIN.run(store, job, inputs)
    changed = [METHOD.model_copy(update={"family": "dense"}),
               *(METHOD.model_copy(update={"multi_vector": SETTINGS.model_copy(update=change)})
                 for change in ({"dim": 8}, {"scale": 2.0}, {"skip_punctuation": False}))]
    keyed = [TRAIN.ref(TrainJob.for_method(tiny_dir, m, cfg, None), inputs).key for m in changed]
    assert len({trained.key, *keyed}) == 5  # the family and each of its settings are in the key
    folder = str(store.path(trained) / "model")
    model = MultiVectorEncoder(folder, device="cpu")
    assert [type(m) for m in model] == [type(model[0]), Dense, MultiVectorMask, Normalize]
    texts = ["Heart attack risk, in adults.", "Asthma in children"]
    queries, documents = model.encode_query(texts), model.encode_document(texts)
    assert [q.shape[1] for q in queries] == [SETTINGS.dim] * 2
    assert documents[0].shape[0] == queries[0].shape[0] - 2  # a document's punctuation ("," and ".") is not scored
    assert torch.allclose(documents[0].norm(dim=-1), torch.ones(len(documents[0])))
    start = multi_vector(tiny_dir).state_dict()["1.linear.weight"]  # the job's seed draws the same start
    assert not torch.equal(model.state_dict()["1.linear.weight"], start)
    curve = store.read_table(trained, "training")
    assert curve.num_rows == 6 and pc.all(pc.is_valid(curve["loss"])).as_py()
    assert pc.is_valid(curve["probe_cosine"]).to_pylist().count(True) >= 1  # the health probe reads it too
    # read as one vector a text (kNN, STS, geometry): the mean of its document token vectors, as loaded above
    vectors = encode.encoder_at(folder, "cpu", dtype="fp32").encode(texts, max_length=cfg.max_length)
    assert torch.allclose(torch.from_numpy(vectors), torch.stack([d.mean(0) for d in documents]), atol=1e-5)
    with pytest.raises(InputError, match="a multi_vector model runs on torch here, not on onnx"):
        encode.encoder_at(folder, backend="onnx")
    with pytest.raises(InputError, match=r"a multi_vector model \(MultiVectorEncoder\), which .*cannot read; "
                                         "encode.encoder_at reads it as"):
        encode.PooledEncoder(folder)  # its backbone's token states alone are not the model


def test_freezing_checkpointing_a_layer_and_the_learning_curve_train_a_multi_vector_model(tiny_dir, tmp_path):
    cfg = CFG.model_copy(update={"freeze_embeddings": True, "gradient_checkpointing": True, "layer": 1})
    job = TrainJob.for_method(tiny_dir, METHOD, cfg, None)
    model = training_model(tiny_dir, job, "cpu")
    assert isinstance(model, MultiVectorEncoder) and model.transformers_model.is_gradient_checkpointing
    before = {k: v.clone() for k, v in model.state_dict().items()}
    curve = knn_curve(model, pa.table({"text": [t for t, _ in PAIRS[0]], "label": [str(i % 3) for i in range(20)]}),
                      KnnConfig(k=3, repeats=1), 4)
    train_model(frozen_objective(model, job), PairBatches(model_tokens_file(model, PAIRS), CFG.batch_size), cfg,
                Checkpoints(tmp_path), measure=curve)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if ".embeddings." in k)
    assert not torch.equal(before["1.linear.weight"], after["1.linear.weight"])
    assert 0 <= curve() <= 1


def test_a_recipe_that_cannot_train_the_family_is_one_error_naming_both():
    with pytest.raises(ValueError, match="recipe tsdae cannot train the multi_vector family.*crops, dropout"):
        MethodConfig(name="t", recipe="tsdae", family="multi_vector")


def test_the_docs_name_the_recipes_the_family_trains():
    bullet = next(b for b in (REPO / "docs" / "families.md").read_text().split("\n- ") if b.startswith("Recipes:"))
    assert set(re.findall(r"`(\w+)`", bullet.split("The others")[0])) == FAMILIES["multi_vector"].recipes
