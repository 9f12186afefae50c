import pytest
import torch
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

from tasks.config.base import InputError
from tasks.config.training import MethodConfig, SparseSettings
from tasks.encoders import encode, families
from tasks.encoders.models import sentence_model
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model
from tasks.tokens import TOKENS, TokensInputs, TokensJob
from tasks.train import TRAIN, TrainInputs, TrainJob
from tests.helpers import model_tokens_file, straight_and_resumed
from tests.tasks.encoders.test_families import CFG, PAIRS

SETTINGS = SparseSettings(active_dims=8)  # of 4 x 32 = 128 codes (the tiny encoder is 32 wide)
METHOD = MethodConfig(name="crops-sparse", recipe="crops", family="sparse", sparse=SETTINGS)


def sparse(tiny_dir, seed=0, settings=SETTINGS):
    return families.sparse_model(sentence_model(tiny_dir, CFG.max_length), settings, seed)


def test_the_autoencoder_is_drawn_from_the_seed_alone_and_keeps_the_top_codes(tiny_dir):
    torch.manual_seed(1)
    a = sparse(tiny_dir)
    torch.manual_seed(2)
    b = sparse(tiny_dir)
    weight = a[2].encoder.weight
    assert weight.shape == (128, 32) and torch.equal(weight, b[2].encoder.weight)
    assert not torch.equal(weight, sparse(tiny_dir, seed=1)[2].encoder.weight)
    codes = a.encode(["Heart attack risk in adults", "Asthma in children"], convert_to_sparse_tensor=False)
    assert codes.shape == (2, 128) and ((codes != 0).sum(1) <= SETTINGS.active_dims).all()
    with pytest.raises(InputError, match="sparse.active_dims: 64, but CSR's loss reconstructs from the top 4 x 64 of "
                                         "128 codes.*at most 32"):
        sparse(tiny_dir, settings=SparseSettings(active_dims=64))


def test_a_sparse_model_resumes_after_a_kill_to_the_same_weights(tiny_dir, tmp_path):
    def run(folder, on_step=None):
        model = sparse(tiny_dir)
        objective = build_objective(model, "crops", CFG, None, None, family=SETTINGS)
        history = train_model(objective, PairBatches(model_tokens_file(model, PAIRS), CFG.batch_size), CFG,
                              Checkpoints(folder), on_step=on_step)
        return model, history

    (straight, full), (resumed, rest) = straight_and_resumed(run, tmp_path / "a", tmp_path / "b")
    assert [h.loss for h in rest] == [h.loss for h in full] and len(full) == 10
    a, b, untrained = straight.state_dict(), resumed.state_dict(), sparse(tiny_dir).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the dead-code counters too
    assert not torch.equal(a["2.encoder.weight"], untrained["2.encoder.weight"])  # the autoencoder trained
    assert not torch.equal(a["0.model.embeddings.word_embeddings.weight"],
                           untrained["0.model.embeddings.word_embeddings.weight"])  # and the encoder under it


def test_the_loss_is_csr_infonce_plus_its_reconstructions(tiny_dir):
    model = sparse(tiny_dir)
    objective = build_objective(model, "crops", CFG, None, None, family=SETTINGS)
    features = objective.collate(PAIRS[0][:4])
    terms = objective.loss.loss(features)
    assert set(terms) == {"reconstruction_loss_k", "reconstruction_loss_4k", "reconstruction_loss_aux", "base_loss"}
    assert objective.loss(features).item() == pytest.approx(sum(t.item() for t in terms.values()), rel=1e-5)
    assert objective.chance is None  # the reconstructions add to the InfoNCE: no chance level to sit at


def test_the_train_stage_saves_a_sparse_model_that_sentence_transformers_loads(demo, tiny_dir):
    store, pairs = demo
    ref = pairs("crops")
    cfg = CFG.model_copy(update={"checkpoint_every": 100, "max_steps": 6})
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, METHOD, cfg), TokensInputs(pairs=ref))
    job = TrainJob.for_method(tiny_dir, METHOD, cfg, None)
    inputs = TrainInputs(pairs=ref, tokens=tokens)
    trained = TRAIN.run(store, job, inputs)
    changed = [METHOD.model_copy(update={"family": "dense"}),
               *(METHOD.model_copy(update={"sparse": SETTINGS.model_copy(update=change)})
                 for change in ({"active_dims": 4}, {"width": 64}, {"aux_weight": 0.2}, {"scale": 2.0}))]
    keyed = [TRAIN.ref(TrainJob.for_method(tiny_dir, m, cfg, None), inputs).key for m in changed]
    assert len({trained.key, *keyed}) == 6  # the family and each of its settings are in the key
    folder = str(store.path(trained) / "model")
    model = SparseEncoder(folder, device="cpu")
    assert isinstance(model[2], SparseAutoEncoder) and model[2].k == SETTINGS.active_dims
    texts = ["Heart attack risk, in adults.", "Asthma in children"]
    codes = model.encode(texts, convert_to_sparse_tensor=False)
    # what scoring reads: the same codes, zeros included, and a query meets a document by their dot product
    encoder = encode.encoder_at(folder, "cpu", dtype="fp32")
    assert encoder.similarity == "dot" and encoder.dim == 128
    vectors = encoder.encode(texts, max_length=cfg.max_length)
    assert torch.allclose(torch.from_numpy(vectors), codes, atol=1e-5)
    assert torch.allclose(model.similarity(codes, codes), torch.from_numpy(vectors @ vectors.T), atol=1e-4)
    curve = store.read_table(trained, "training")
    assert curve.num_rows == 6 and curve["probe_cosine"].is_valid().to_pylist().count(True) >= 1
    with pytest.raises(InputError, match="a sparse model runs on torch here, not on onnx"):
        encode.encoder_at(folder, backend="onnx")
    with pytest.raises(InputError, match=r"a sparse model \(SparseEncoder\), which .*cannot read"):
        encode.PooledEncoder(folder)
