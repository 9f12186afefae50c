import json
import logging
import re
import shutil
from pathlib import Path

import huggingface_hub
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import MultiVectorEncoder, SparseEncoder
from sentence_transformers.base.modules import Normalize
from sentence_transformers.base.modules.dense import Dense
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder
from transformers import AutoTokenizer, DistilBertConfig, DistilBertForMaskedLM

from tasks.config.base import InputError
from tasks.config.families import FAMILIES
from tasks.config.family_settings import MultiVectorSettings, SparseSettings
from tasks.config.model import Prompts
from tasks.config.splits import KnnConfig
from tasks.config.training import MethodConfig, TrainConfig
from tasks.encoders import encode, families
from tasks.encoders.inputs import Tokens, features
from tasks.encoders.models import sentence_model
from tasks.methods.batches import PairBatches
from tasks.methods.mlm import masked_lm_head
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
SPARSE = SparseSettings(active_dims=8)  # of 4 x 32 = 128 codes (the tiny encoder is 32 wide)
SPARSE_METHOD = MethodConfig(name="crops-sparse", recipe="crops", family="sparse", sparse=SPARSE)
SPLADE = SparseSettings(kind="splade", active_dims=16)  # of MiniLM's 30,522 terms


def splade(base, seed=0, settings=SPLADE):
    return families.splade_model(base, settings, CFG.max_length, "cpu", seed)


def multi_vector(tiny_dir, seed=0):
    return families.multi_vector_model(sentence_model(tiny_dir, CFG.max_length), SETTINGS, seed)


def sparse(tiny_dir, seed=0, settings=SPARSE):
    return families.sparse_model(sentence_model(tiny_dir, CFG.max_length), settings, seed)


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


@pytest.mark.parametrize("family, cached", [("multi_vector", False), ("multi_vector", True), ("sparse", False),
                                            ("splade", False), ("splade", True)])
def test_a_model_of_each_family_resumes_after_a_kill_to_the_same_weights(tiny_dir, tmp_path, family, cached, request):
    build, settings, head = {"multi_vector": (multi_vector, SETTINGS, "1.linear.weight"),
                             "sparse": (sparse, SPARSE, "3.encoder.weight"),
                             "splade": (splade, SPLADE, "0.model.cls.predictions.transform.dense.weight")}[family]
    base = request.getfixturevalue("tiny_mlm_dir") if family == "splade" else tiny_dir
    cfg = CFG.model_copy(update={"mini_batch_size": 3}) if cached else CFG  # GradCache: 3 + 1 rows, dropout replayed

    def run(folder, on_step=None):
        model = build(base)
        objective = build_objective(model, "crops", cfg, None, None, family=settings)
        history = train_model(objective, PairBatches(model_tokens_file(model, PAIRS), cfg.batch_size), cfg,
                              Checkpoints(folder), on_step=on_step)
        return model, history

    (straight, full), (resumed, rest) = straight_and_resumed(run, tmp_path / "a", tmp_path / "b")
    assert [h.loss for h in rest] == [h.loss for h in full] and len(full) == 10
    a, b, untrained = straight.state_dict(), resumed.state_dict(), build(base).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # a sparse model's dead-code counters too
    assert not torch.equal(a[head], untrained[head])  # the family's head trained
    word = next(k for k in a if k.endswith("embeddings.word_embeddings.weight"))
    assert not torch.equal(a[word], untrained[word])  # and the encoder under it


def trained_in_store(demo, tiny_dir, method: MethodConfig, *changes: dict):
    """`method` trained for 6 steps by the train stage on the demo's crops: (its store, its artifact, the config).
    Each of `changes` to the family's settings, and the method as a dense one, are other keys."""
    store, pairs = demo
    ref = pairs("crops")
    cfg = CFG.model_copy(update={"checkpoint_every": 100, "max_steps": 6})
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, method, cfg), TokensInputs(pairs=ref))
    inputs = TrainInputs(pairs=ref, tokens=tokens)
    trained = TRAIN.run(store, TrainJob.for_method(tiny_dir, method, cfg, None), inputs)
    settings = method.family_settings
    changed = [method.model_copy(update={"family": "dense"}),
               *(method.model_copy(update={method.family: settings.model_copy(update=c)}) for c in changes)]
    keyed = {TRAIN.ref(TrainJob.for_method(tiny_dir, m, cfg, None), inputs).key for m in changed}
    assert len({trained.key, *keyed}) == len(changes) + 2  # the family and each of its settings are in the key
    return store, trained, cfg


def test_an_mlm_method_saves_its_head_beside_its_model_and_a_splade_model_of_that_model_starts_from_it(
        demo, tiny_dir, caplog, tmp_path):
    store, pairs = demo
    method, cfg = MethodConfig(name="mlm", recipe="mlm"), CFG.model_copy(update={"max_steps": 4})
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, method, cfg), TokensInputs(pairs=pairs("mlm")))
    trained = TRAIN.run(store, TrainJob.for_method(tiny_dir, method, cfg, None),
                        TrainInputs(pairs=pairs("mlm"), tokens=tokens))
    folder = store.path(trained) / "model"
    saved = load_file(folder / families.MLM_HEAD)
    assert "predictions.decoder.weight" not in saved  # the word embeddings, saved with the model
    with caplog.at_level(logging.WARNING):
        drawn = splade(tiny_dir)  # tiny_dir has no head: drawn from the seed, as the mlm method's started
        assert "no trained masked-LM head" in caplog.text
        caplog.clear()
        model = splade(str(folder))
        assert "no trained masked-LM head" not in caplog.text
    head, before = model[0].auto_model.cls, drawn[0].auto_model.cls.state_dict()
    assert all(torch.equal(head.state_dict()[k], v) for k, v in saved.items())
    assert not torch.equal(saved["predictions.transform.dense.weight"], before["predictions.transform.dense.weight"])
    assert head.predictions.decoder.weight is model[0].auto_model.get_input_embeddings().weight  # still tied
    again = masked_lm_head(sentence_model(str(folder), CFG.max_length))  # an mlm method starting from it goes on
    assert torch.equal(again.state_dict()["predictions.transform.dense.weight"],
                       saved["predictions.transform.dense.weight"])
    save_file({"predictions.bias": saved["predictions.bias"]}, str(tmp_path / families.MLM_HEAD))  # not a whole head
    with pytest.raises(InputError, match=r"mlm_head.safetensors: not this model's masked-LM head \(missing "
                                         r"\['predictions.decoder.bias', 'predictions.transform"):
        families.load_head(model[0].auto_model, str(tmp_path))


def test_a_base_whose_masked_lm_head_has_several_parts_reads_its_own(tiny_dir, tmp_path):
    # DistilBERT's head is three modules (no one child to load a saved head into): with no head file, none is looked for
    config = DistilBertConfig(vocab_size=AutoTokenizer.from_pretrained(tiny_dir).vocab_size, dim=32, n_layers=1,
                              n_heads=2, hidden_dim=64)
    torch.manual_seed(0)
    DistilBertForMaskedLM(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path)
    model = splade(str(tmp_path))
    assert model.encode(["heart attack risk"]).shape[-1] == config.vocab_size


def test_the_train_stage_saves_a_multi_vector_model_that_sentence_transformers_loads(demo, tiny_dir, caplog):
    expanding = METHOD.model_copy(update={"multi_vector": SETTINGS.model_copy(update={"query_expansion": 8})})
    with caplog.at_level(logging.INFO):
        store, trained, cfg = trained_in_store(demo, tiny_dir, expanding, {"dim": 8}, {"scale": 2.0},
                                               {"skip_punctuation": False}, {"query_expansion": None})
    # the demo's crops are all longer than 8 tokens: the filling never trains, and the log says so
    assert "0.0% of the anchors are shorter than 8 tokens, the only ones it fills in training" in caplog.text
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
    # queries widened to 8 tokens by [MASK] in training, in the saved model's encode_query, and where embforge scores
    expanded = encode.encoder_at(folder, "cpu", dtype="fp32")
    ours = next(expanded.token_chunks(["Asthma"], cfg.max_length, task="query"))[2][0]
    assert ours.shape[0] == 8 and np.allclose(ours, model.encode_query(["Asthma"])[0].numpy(), atol=1e-5)
    with pytest.raises(InputError, match="a multi_vector model runs on torch here, not on onnx"):
        encode.encoder_at(folder, backend="onnx")
    with pytest.raises(InputError, match=r"a multi_vector model \(MultiVectorEncoder\), which .*cannot read; "
                                         "encode.encoder_at reads it as"):
        encode.PooledEncoder(folder)  # its backbone's token states alone are not the model


QUERIES = ["heart", "asthma in children and adults", "a much longer query about the risk of heart attack in adults"]


def test_queries_are_expanded_as_sentence_transformers_expands_them(tiny_dir):
    model = families.multi_vector_model(sentence_model(tiny_dir, CFG.max_length),
                                        SETTINGS.model_copy(update={"query_expansion": 8}), seed=0)
    theirs = model.preprocess(QUERIES, task="query")  # the library's own: what the saved model's encode_query does
    stored = [Tokens(np.array(ids, np.int32)) for ids in model.tokenizer(QUERIES)["input_ids"]]
    for ours in (features(model, QUERIES, "query"), features(model, stored, "query")):  # texts, the tokens stage's ids
        for name in ("input_ids", "attention_mask", "query_expansion_positions"):
            assert torch.equal(ours[name], theirs[name]), name
    slots = theirs["query_expansion_positions"]
    assert slots.shape[1] >= 8 and slots[0].sum() == 8 - 3 and not slots[2].any()  # "heart": [CLS] heart [SEP]
    assert (theirs["input_ids"][slots] == model.tokenizer.mask_token_id).all()
    assert "query_expansion_positions" not in features(model, stored, "document")  # documents as they are


def test_a_multi_vector_model_s_anchors_take_the_query_prompt(tiny_dir):
    prompts = Prompts(query="[Q] ", document="[D] ")
    assert TokensJob.for_method(tiny_dir, METHOD, CFG, prompts).prompts == {
        "anchor": "[Q] ", "positive": "[D] ", "negative": "[D] "}  # the loss reads anchors as queries
    dense = METHOD.model_copy(update={"family": "dense", "multi_vector": None})
    assert set(TokensJob.for_method(tiny_dir, dense, CFG, prompts).prompts.values()) == {"[D] "}  # crops: documents


def in_hub_cache(cache, repo: str, folder) -> None:
    """`folder` as huggingface_hub keeps a downloaded repository: what it reads offline."""
    root, commit = cache / f"models--{repo.replace('/', '--')}", "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(folder, root / "snapshots" / commit)


def test_a_hub_model_s_family_is_read_from_its_repository(tiny_dir, tmp_path, monkeypatch):
    # The Hub cannot be reached here: its repositories are in huggingface_hub's cache, read offline (HF_HUB_OFFLINE).
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    multi_vector(tiny_dir).save(str(tmp_path / "colbert"))
    in_hub_cache(cache, "someone/colbert", tmp_path / "colbert")
    in_hub_cache(cache, "someone/dense", tiny_dir)
    pylate = shutil.copytree(tiny_dir, tmp_path / "pylate")  # PyLate v3's own model type
    (pylate / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "ColBERT"}))
    in_hub_cache(cache, "someone/pylate", pylate)
    stanford = tmp_path / "stanford"  # a Stanford ColBERT checkpoint: its config.json names its architecture
    stanford.mkdir()
    bert = json.loads((Path(tiny_dir) / "config.json").read_text())
    (stanford / "config.json").write_text(json.dumps({**bert, "architectures": ["HF_ColBERT"]}))
    in_hub_cache(cache, "someone/stanford", stanford)
    plain = tmp_path / "plain"  # a plain BERT (no sentence-transformers config): a dense base
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(bert))
    in_hub_cache(cache, "someone/bert", plain)

    monkeypatch.setattr(families, "HUB_FAMILIES", {})  # what this cache holds
    assert {repo: families.family_of(f"someone/{repo}") for repo in ("colbert", "pylate", "stanford", "dense", "bert")
            } == {"colbert": "multi_vector", "pylate": "multi_vector", "stanford": "multi_vector", "dense": "dense",
                  "bert": "dense"}
    assert families.family_of("someone/not-cached") == "dense"  # offline, nothing to read: as a base is read
    assert set(families.HUB_FAMILIES) == {f"someone/{r}" for r in ("colbert", "pylate", "stanford", "dense", "bert")}
    model = families.load_saved("someone/colbert", "cpu")
    assert isinstance(model, MultiVectorEncoder) and model[1].linear.weight.shape == (SETTINGS.dim, 32)


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


def test_the_autoencoder_is_drawn_from_the_seed_alone_and_keeps_the_top_codes(tiny_dir):
    torch.manual_seed(1)
    a = sparse(tiny_dir)
    torch.manual_seed(2)
    b = sparse(tiny_dir)
    weight = a[3].encoder.weight
    assert weight.shape == (128, 32) and torch.equal(weight, b[3].encoder.weight)
    assert not torch.equal(weight, sparse(tiny_dir, seed=1)[3].encoder.weight)
    codes = a.encode(["Heart attack risk in adults", "Asthma in children"], convert_to_sparse_tensor=False)
    assert codes.shape == (2, 128) and ((codes != 0).sum(1) <= SPARSE.active_dims).all()
    with pytest.raises(InputError, match="sparse.active_dims: 64, but CSR's loss reconstructs from the top 4 x 64 of "
                                         "128 codes.*at most 32"):
        sparse(tiny_dir, settings=SparseSettings(active_dims=64))


def test_a_sparse_model_starts_its_codes_from_the_principal_directions_of_its_training_texts(tiny_dir):
    model = sparse(tiny_dir)
    texts = [t for pair in PAIRS[0] for t in pair]  # 40 texts, 32 wide
    families.start_codes(model, texts, 4, seed=0)
    assert model.training  # left to train (dropout on)
    rows = model[3].encoder.weight.detach()  # (128 codes, 32): Normalize comes before the autoencoder
    assert torch.equal(rows[32:64], -rows[:32]) and torch.equal(rows[96:], -rows[64:96])  # both signs
    assert torch.allclose(rows[:32] @ rows[:32].T, torch.eye(32), atol=1e-5)  # an orthonormal basis
    dense = sentence_model(tiny_dir, CFG.max_length).encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    assert torch.linalg.norm(dense @ rows[0]) == pytest.approx(torch.linalg.svdvals(dense)[0].item(), rel=1e-4)
    assert not model[3].pre_bias.any()
    # its codes: the top 8 coordinates of the text's unit vector in that basis (positive part, each sign a code)
    coordinates = dense[:6] @ rows.T  # (6, 128)
    top = coordinates.topk(SPARSE.active_dims).indices
    expected = torch.zeros_like(coordinates).scatter(1, top, coordinates.gather(1, top)).clamp(min=0)
    assert torch.allclose(model.encode(texts[:6], convert_to_sparse_tensor=False), expected, atol=1e-5)


def test_the_loss_is_csr_infonce_plus_its_reconstructions(tiny_dir):
    model = sparse(tiny_dir)
    objective = build_objective(model, "crops", CFG, None, None, family=SPARSE)
    features = objective.collate(PAIRS[0][:4])
    terms = objective.loss.loss(features)
    assert set(terms) == {"reconstruction_loss_k", "reconstruction_loss_4k", "reconstruction_loss_aux", "base_loss"}
    assert objective.loss(features).item() == pytest.approx(sum(t.item() for t in terms.values()), rel=1e-5)
    assert objective.chance is None  # the reconstructions add to the InfoNCE: no chance level to sit at


def test_the_train_stage_saves_a_sparse_model_that_sentence_transformers_loads(demo, tiny_dir):
    store, trained, cfg = trained_in_store(demo, tiny_dir, SPARSE_METHOD, {"active_dims": 4}, {"width": 64},
                                           {"aux_weight": 0.2}, {"scale": 2.0})
    folder = str(store.path(trained) / "model")
    model = SparseEncoder(folder, device="cpu")
    assert isinstance(model[3], SparseAutoEncoder) and model[3].k == SPARSE.active_dims
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
