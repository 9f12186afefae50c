"""SPLADE, the sparse family's masked-LM kind (tasks/encoders/families.py's splade_model)."""

import logging

import numpy as np
import pytest
import torch
from sentence_transformers import SparseEncoder
from sentence_transformers.base.modules import Transformer
from sentence_transformers.sparse_encoder.modules import SpladePooling
from transformers import AutoModelForMaskedLM, AutoTokenizer

from tasks.config.base import InputError
from tasks.config.data import DataConfig
from tasks.config.family_settings import SparseSettings
from tasks.config.training import MethodConfig, TrainConfig, family_conflicts
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob, read_codes, read_embeddings
from tasks.encoders import encode, models
from tasks.ingest import INGEST
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model
from tests.helpers import DEMO_DOCS, model_tokens_file
from tests.tasks.encoders.test_families import CFG, PAIRS, SPLADE, splade, trained_in_store

TEXTS = ["Heart attack risk, in adults.", "Asthma in children"]


def term_weights(base: str, texts: list[str], top: int) -> torch.Tensor:
    """SPLADE by hand: the head's logits, log(1 + ReLU), each term's maximum over the text's tokens, its top `top`."""
    mlm, tokenizer = AutoModelForMaskedLM.from_pretrained(base).eval(), AutoTokenizer.from_pretrained(base)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = mlm(**batch).logits  # (texts, tokens, vocab)
    weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"][..., None]
    pooled = weights.max(1).values  # (texts, vocab)
    kept = pooled.topk(top).indices
    return torch.zeros_like(pooled).scatter(1, kept, pooled.gather(1, kept))


def test_a_splade_model_reads_term_weights_from_the_masked_lm_head(tiny_mlm_dir, caplog):
    with caplog.at_level(logging.WARNING):
        model = splade(tiny_mlm_dir)
    assert "no trained masked-LM head" not in caplog.text
    assert isinstance(model[0], Transformer) and isinstance(model[1], SpladePooling)
    codes = model.encode(TEXTS, convert_to_sparse_tensor=False)
    assert codes.shape == (2, 30522) and ((codes != 0).sum(1) == SPLADE.active_dims).all()
    assert torch.allclose(codes, term_weights(tiny_mlm_dir, TEXTS, SPLADE.active_dims), atol=1e-5)


def test_a_base_without_a_head_gets_one_drawn_from_the_seed_with_a_warning(tiny_dir, caplog):
    with caplog.at_level(logging.WARNING):
        torch.manual_seed(1)
        a = splade(tiny_dir)
    assert "its checkpoint has no trained masked-LM head" in caplog.text
    torch.manual_seed(2)
    head = "model.cls.predictions.transform.dense.weight"
    assert torch.equal(a[0].state_dict()[head], splade(tiny_dir)[0].state_dict()[head])
    assert not torch.equal(a[0].state_dict()[head], splade(tiny_dir, seed=1)[0].state_dict()[head])


def test_a_decoder_base_is_one_error_naming_the_kind(tiny_decoder_dir):
    with pytest.raises(InputError, match="SPLADE .*reads term weights from a masked-LM head, and transformers has "
                                         "none for a llama model; use sparse.kind csr"):
        splade(tiny_decoder_dir)


def test_the_loss_is_infonce_plus_the_flops_regularisers(tiny_mlm_dir):
    settings = SPLADE.model_copy(update={"document_regularizer": 0.01, "query_regularizer": 0.02})
    model = splade(tiny_mlm_dir, settings=settings)
    objective = build_objective(model, "crops", CFG, None, None, family=settings)
    features = objective.collate(PAIRS[0][:4])
    terms = objective.loss.loss(features)
    assert set(terms) == {"base_loss", "document_regularizer_loss", "query_regularizer_loss"}
    model.eval()  # no dropout: the same term weights as the loss's forward pass
    queries, documents = (model(f)["sentence_embedding"] for f in features)
    flops = lambda x: (x.mean(0) ** 2).sum()  # noqa: E731 (squared mean weight of each term, summed)
    assert terms["query_regularizer_loss"].item() == pytest.approx(0.02 * flops(queries).item(), rel=1e-4)
    assert terms["document_regularizer_loss"].item() == pytest.approx(0.01 * flops(documents).item(), rel=1e-4)
    scores = queries @ documents.T  # scale 1: SPLADE's unbounded weights meet by their dot product
    info_nce = torch.nn.functional.cross_entropy(scores, torch.arange(4))
    assert terms["base_loss"].item() == pytest.approx(info_nce.item(), rel=1e-4)
    assert objective.chance is None


def test_the_regularisers_warm_up_quadratically_as_the_library_trainer_has_them(tiny_mlm_dir, tmp_path):
    """Both FLOPS weights rise from 0 to the loss's own over the first third of the steps (sentence-transformers'
    trainer default), step by step in the training loop, and from a checkpoint as in one run; 0: fixed from the
    start."""
    model = splade(tiny_mlm_dir)
    cfg = CFG.model_copy(update={"eval_every": 0})
    objective = build_objective(model, "crops", cfg, None, None, family=SPLADE)
    loss = objective.loss.loss
    seen = []
    batches = PairBatches(model_tokens_file(model, PAIRS), cfg.batch_size)  # 10 steps: a warm-up of 3
    train_model(objective, batches, cfg, Checkpoints(tmp_path / "a"),
                on_step=lambda h: seen.append((loss.query_regularizer_weight, loss.document_regularizer_weight)))
    share = [0, 1 / 9, 4 / 9] + [1] * 7  # (step / 3)² until step 3
    assert seen == [pytest.approx((5e-5 * s, 3e-5 * s)) for s in share]
    again = build_objective(splade(tiny_mlm_dir), "crops", cfg, None, None, family=SPLADE)
    again.at_step(2, 10)  # a process that resumes at the third step
    assert (again.loss.loss.query_regularizer_weight, again.loss.loss.document_regularizer_weight) == seen[2]
    fixed = SPLADE.model_copy(update={"regularizer_warmup": 0})
    assert build_objective(splade(tiny_mlm_dir), "crops", cfg, None, None, family=fixed).at_step is None
    with pytest.raises(ValueError, match="regularizer_warmup: not settings of kind 'csr'"):
        SparseSettings(regularizer_warmup=0.5)


def test_each_kind_refuses_the_others_settings_and_what_it_does_not_train_with():
    with pytest.raises(ValueError, match="document_regularizer: not settings of kind 'csr' .*SPLADE's"):
        SparseSettings(document_regularizer=1e-4)
    with pytest.raises(ValueError, match="width, aux_dims: not settings of kind 'splade' .*CSR's"):
        SparseSettings(kind="splade", width=512, aux_dims=64)
    assert SparseSettings(kind="splade").resolved_scale == 1.0 and SparseSettings().resolved_scale == 20.0
    for kind in ("csr", "splade"):  # the settings read back from their dump, every field in it
        settings = SparseSettings(kind=kind)
        assert SparseSettings.model_validate(settings.model_dump()) == settings
    train = TrainConfig(pooling="cls", mini_batch_size=8)
    assert family_conflicts("sparse", train, SPLADE) == ["pooling (SPLADE takes each term's maximum over the tokens)"]
    assert family_conflicts("sparse", train, SparseSettings())[0].startswith("mini_batch_size (CSR's loss")


def test_the_train_stage_saves_a_splade_model_whose_stored_codes_sentence_transformers_gives(demo, tiny_mlm_dir):
    method = MethodConfig(name="crops-splade", recipe="crops", family="sparse", sparse=SPLADE)
    store, trained, cfg = trained_in_store(demo, tiny_mlm_dir, method, {"active_dims": 8},
                                           {"document_regularizer": 1e-3}, {"query_regularizer": 1e-3},
                                           {"scale": 2.0})
    folder = str(store.path(trained) / "model")
    model = SparseEncoder(folder, device="cpu")
    assert isinstance(model[1], SpladePooling) and model.max_active_dims == SPLADE.active_dims
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=60), NoInputs())
    texts = store.read_table(docs, "documents")["text"].to_pylist()
    ref = EMBED.run(store, EmbedJob(model=folder, max_length=cfg.max_length, batch_size=8), EmbedInputs(documents=docs))
    codes = read_codes(store, ref)  # stored as each text's active terms
    assert codes.shape == (60, 30522) and codes.getnnz(axis=1).max() <= SPLADE.active_dims
    expected = model.encode(texts, convert_to_sparse_tensor=False, batch_size=8).numpy()
    np.testing.assert_allclose(codes.toarray(), expected, atol=1e-5)
    np.testing.assert_array_equal(read_embeddings(store, ref, "cls"), codes.toarray())  # one vector, any pooling
    assert store.manifest(ref)["extra"]["similarity"] == "dot"
    assert encode.encoder_at(folder, "cpu").dim == 30522


def test_freezing_the_embeddings_freezes_the_base_models_and_the_tied_projection_alone(tiny_mlm_dir):
    model = splade(tiny_mlm_dir)
    models.freeze(model, embeddings=True, layers=0)
    frozen = {name for name, p in model[0].auto_model.named_parameters() if not p.requires_grad}
    assert frozen == {f"bert.embeddings.{n}" for n in ("word_embeddings.weight", "position_embeddings.weight",
                                                       "token_type_embeddings.weight", "LayerNorm.weight",
                                                       "LayerNorm.bias")}
    head = model[0].auto_model.cls.predictions
    assert head.decoder.weight is model[0].auto_model.bert.embeddings.word_embeddings.weight  # one matrix
    assert head.transform.dense.weight.requires_grad
