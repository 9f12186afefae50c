import io
import signal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from prefect.exceptions import TerminationSignal
from sentence_transformers import SentenceTransformer

from storage.base import ArtifactRef
from tasks.config.base import InputError
from tasks.config.evaluation import KnnConfig
from tasks.config.model import ModelConfig, RandomInitConfig
from tasks.config.training import MethodConfig, TrainConfig
from tasks.encoders.models import checkpoint_activations, save_random_encoder, sentence_model
from tasks.methods import training
from tasks.methods.batches import PairBatches
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, train_model
from tasks.tokens import TOKENS, TokensInputs, TokensJob
from tasks.train import STATE, TRAIN, TrainInputs, TrainJob, frozen_objective, knn_curve
from tests.helpers import model_tokens_file, straight_and_resumed

CFG = TrainConfig(batch_size=4, lr=1e-3, max_length=32, checkpoint_every=2, warmup_ratio=0.1)
PAIRS = [[(f"doc {i} first part about topic {i % 3}", f"doc {i} second part, topic {i % 3}")
          for i in range(e, e + 20)] for e in range(2)]  # 2 epochs x 5 batches


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("init") / "model"
    cfg = ModelConfig(random_init=RandomInitConfig(layers=1, hidden=32, heads=2, intermediate=64))
    save_random_encoder(cfg.name_or_path, cfg.random_init, folder)
    return str(folder)


def train_model_on(objective, pairs_per_epoch, cfg, checkpoints, **kwargs):
    """Train on the pairs' token ids, as the train stage reads them (tasks/tokens.py); with each id's word,
    which only RetroMAE reads."""
    model = next(m for m in objective.loss.modules() if isinstance(m, SentenceTransformer))
    tokens = model_tokens_file(model, pairs_per_epoch, word_ids=True)
    return train_model(objective, PairBatches(tokens, cfg.batch_size), cfg, checkpoints, **kwargs)


def train_contrastive(model, pairs, cfg, checkpoints, on_step=None):
    return train_model_on(build_objective(model, "crops", cfg, None, None), pairs, cfg, checkpoints, on_step=on_step)


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def killed_at_step_7(init_dir, folder, cfg=CFG, device="cpu"):
    """A training run killed after step 7: checkpoints at steps 2, 4 and 6 (the last two kept)."""
    def crash(entry):
        if entry.step == 7:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        train_contrastive(sentence_model(init_dir, cfg.max_length, device), PAIRS, cfg, Checkpoints(folder),
                          on_step=crash)


@pytest.mark.parametrize("precision", [
    "fp32", "bf16",
    pytest.param("fp16", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 trains on CUDA"))])
def test_resume_after_a_crash_gives_bit_identical_weights(init_dir, tmp_path, precision):
    # Unclipped, as the 5% bound on the lower precision's drift below was set (clipped at 1.0, bf16's
    # 10th step drifts 5.4% from fp32's; clipping's own resume is in the other tests here).
    cfg = CFG.model_copy(update={"precision": precision, "max_grad_norm": None})
    device = "cuda" if precision == "fp16" else "cpu"
    straight = sentence_model(init_dir, cfg.max_length, device)
    full = train_contrastive(straight, PAIRS, cfg, Checkpoints(tmp_path / "a"))
    killed_at_step_7(init_dir, tmp_path / "b", cfg, device)
    saved = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert saved["history"][-1]["step"] == 6
    assert (saved["scaler"] is not None) == (precision == "fp16")  # fp16's loss scale resumes too

    resumed_model = sentence_model(init_dir, cfg.max_length, device)  # a fresh process starts from the init
    resumed = train_contrastive(resumed_model, PAIRS, cfg, Checkpoints(tmp_path / "b"))
    assert [h.loss for h in resumed] == [h.loss for h in full]
    a, b = weights(straight), weights(resumed_model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert {v.dtype for v in a.values() if v.is_floating_point()} == {torch.float32}  # master weights
    untrained = weights(sentence_model(init_dir, 32, device))
    assert not all(torch.equal(a[k], untrained[k]) for k in a)  # training did change the weights
    if precision != "fp32":  # the forward pass did run in the lower precision
        fp32 = train_contrastive(sentence_model(init_dir, cfg.max_length, device), PAIRS,
                                 cfg.model_copy(update={"precision": "fp32"}), Checkpoints(tmp_path / "c"))
        assert [h.loss for h in full] != [h.loss for h in fp32]
        assert [h.loss for h in full] == pytest.approx([h.loss for h in fp32], rel=0.05)


def test_gradient_checkpointing_gives_the_same_weights(init_dir, tmp_path):
    plain = sentence_model(init_dir, CFG.max_length)  # dropout on: the recomputation replays its masks
    checkpointed = sentence_model(init_dir, CFG.max_length)
    checkpoint_activations(checkpointed)
    assert checkpointed.transformers_model.is_gradient_checkpointing
    one = train_contrastive(plain, PAIRS, CFG, Checkpoints(tmp_path / "a"))
    two = train_contrastive(checkpointed, PAIRS, CFG, Checkpoints(tmp_path / "b"))
    assert [h.loss for h in one] == pytest.approx([h.loss for h in two], rel=1e-6)
    a, b = weights(plain), weights(checkpointed)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_schedule_warms_up_over_one_epoch_then_decays_to_zero(init_dir, tmp_path):
    pairs = [[(f"a{i}", f"b{i}") for i in range(40)] for _ in range(3)]  # 10 batches x 3 epochs
    history = train_contrastive(sentence_model(init_dir, 16), pairs, CFG, Checkpoints(tmp_path))
    lrs = [h.lr for h in history]
    # warm-up = 10% of ONE epoch = 1 step (transformers' linear schedule), then linear decay over 30.
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-3 * 1 / 29)
    assert all(x > y for x, y in zip(lrs[1:], lrs[2:]))


@pytest.mark.parametrize("recipe", ["crops", "simcse", "tsdae", "ct", "mlm", "retromae"])
def test_frozen_embeddings_and_layers_stay_bit_identical(tmp_path, recipe):
    folder = tmp_path / "init"
    cfg = ModelConfig(random_init=RandomInitConfig(layers=2, hidden=32, heads=2, intermediate=64))
    save_random_encoder(cfg.name_or_path, cfg.random_init, folder)
    train = CFG.model_copy(update={"freeze_embeddings": True, "freeze_layers": 1})
    model = sentence_model(str(folder), 32)
    objective = frozen_objective(model, TrainJob.for_method(None, MethodConfig(name=recipe, recipe=recipe), train,
                                                            None))
    before = weights(model)
    train_model_on(objective, [PAIRS[0][:8]], train, Checkpoints(tmp_path / "ckpt"))
    after = weights(model)
    frozen = [k for k in before if ".embeddings." in k or ".layer.0." in k]
    trained = [k for k in before if ".layer.1." in k]
    assert frozen and trained
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert all(not torch.equal(before[k], after[k]) for k in trained if k.endswith("weight"))


def test_pooling_modes_pick_the_right_tokens(init_dir):
    texts = ["a short text", "a somewhat longer text with more words"]
    token_states = {}

    def keep(_module, _inputs, output):
        token_states["h"] = output["token_embeddings"]

    for pooling, pick in [("cls", lambda h, n: h[0]), ("sep", lambda h, n: h[n - 1]),
                          ("mean", lambda h, n: h[:n].mean(0))]:
        model = sentence_model(init_dir, 32, pooling=pooling).eval()
        handle = model[0].register_forward_hook(keep)
        features = model.preprocess(texts)
        with torch.no_grad():
            emb = model({k: v for k, v in features.items()})["sentence_embedding"]
        handle.remove()
        for i, n in enumerate(features["attention_mask"].sum(1).tolist()):
            assert torch.allclose(emb[i], pick(token_states["h"][i], n), atol=1e-5), pooling


def test_layer_knob_gives_that_hidden_layer_of_the_full_model(tmp_path):
    folder = tmp_path / "init"
    cfg = ModelConfig(random_init=RandomInitConfig(layers=3, hidden=32, heads=2, intermediate=64))
    save_random_encoder(cfg.name_or_path, cfg.random_init, folder)
    full = sentence_model(str(folder), 32).eval()
    features = full.preprocess(["a text to embed"])
    with torch.no_grad():
        hidden = full[0].auto_model(**{k: v for k, v in features.items() if k != "modality"},
                                    output_hidden_states=True).hidden_states
        for layer in (0, 1, 3):
            cut = sentence_model(str(folder), 32, layer=layer).eval()
            emb = cut(dict(features))["sentence_embedding"]
            assert torch.allclose(emb[0], hidden[layer][0].mean(0), atol=1e-5), layer
    with pytest.raises(Exception, match="train.layer: 4"):
        sentence_model(str(folder), 32, layer=4)


def test_learning_curve_is_measured_every_n_steps_without_changing_training(init_dir, tmp_path):
    cfg = CFG.model_copy(update={"eval_every": 3})
    plain = train_contrastive(sentence_model(init_dir, 32), PAIRS, cfg, Checkpoints(tmp_path / "a"))
    model = sentence_model(init_dir, 32)

    def measure():  # what knn_curve does: encode in eval mode, then back to training mode
        model.encode(["a text"])
        model.train()
        return 0.5

    curve = train_model_on(build_objective(model, "crops", cfg, None, None), PAIRS, cfg, Checkpoints(tmp_path / "b"),
                           measure=measure)
    assert [h.step for h in curve if h.knn_accuracy is not None] == [3, 6, 9, 10]
    assert [h.loss for h in curve] == [h.loss for h in plain]  # measuring does not disturb the RNG


class RunsAShellCommand:
    """What a crafted checkpoint could hold: unpickling it would run `touch`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_runs_nothing_and_training_starts_over(init_dir, tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "b").mkdir()
    torch.save({"history": RunsAShellCommand(marker)}, tmp_path / "b" / "checkpoint.pt")  # a plain pickle inside
    full = train_contrastive(sentence_model(init_dir, CFG.max_length), PAIRS, CFG, Checkpoints(tmp_path / "a"))
    again = train_contrastive(sentence_model(init_dir, CFG.max_length), PAIRS, CFG, Checkpoints(tmp_path / "b"))
    assert not marker.exists()
    assert [h.loss for h in again] == [h.loss for h in full]  # from step 0, as if there were none
    assert (tmp_path / "b" / "checkpoint.pt.unreadable").is_file()


def test_a_truncated_checkpoint_resumes_from_the_one_before(init_dir, tmp_path):
    straight = sentence_model(init_dir, CFG.max_length)
    full = train_contrastive(straight, PAIRS, CFG, Checkpoints(tmp_path / "a"))
    killed_at_step_7(init_dir, tmp_path / "b")
    latest = tmp_path / "b" / "checkpoint.pt"
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])  # a disk that filled up mid-copy
    resumed_model = sentence_model(init_dir, CFG.max_length)
    resumed = train_contrastive(resumed_model, PAIRS, CFG, Checkpoints(tmp_path / "b"))
    assert resumed[3].step == 4 and [h.loss for h in resumed] == [h.loss for h in full]  # from step 4
    assert all(torch.equal(a, b) for a, b in zip(weights(straight).values(), weights(resumed_model).values()))


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), TerminationSignal(signal.SIGTERM)], ids=["ctrl-c", "sigterm"])
def test_a_stop_inside_a_checkpoints_write_is_raised_as_itself_and_the_last_checkpoint_kept(tmp_path, stop,
                                                                                            monkeypatch):
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save({"step": 1, "weights": torch.zeros(4096)})
    real_open = open

    class Stopping(io.FileIO):  # a signal handler that runs while torch's writer is in the file's write
        writes = 0

        def write(self, data):
            Stopping.writes += 1
            if Stopping.writes == 3:  # inside the zip writer (its first write raises as it is)
                raise stop
            return super().write(data)

    def stopping_open(path, mode):
        return Stopping(path, mode) if "w" in mode else real_open(path, mode)

    monkeypatch.setattr(training, "open", stopping_open, raising=False)
    with pytest.raises(type(stop)):  # torch alone turns it into RuntimeError("unexpected pos ...")
        checkpoints.save({"step": 2, "weights": torch.ones(4096)})
    monkeypatch.undo()
    assert checkpoints.load()["step"] == 1


@pytest.mark.parametrize("recipe", ["simcse", "retromae"])
def test_training_only_parts_start_from_the_seed_whatever_was_drawn_before(init_dir, recipe):
    job = TrainJob.for_method(None, MethodConfig(name=recipe, recipe=recipe), CFG, None)

    def training_only_weights() -> dict:
        model = sentence_model(init_dir, CFG.max_length)
        loss = frozen_objective(model, job).loss
        own = {id(p) for p in model.parameters()}
        return {k: v.clone() for k, v in loss.state_dict(keep_vars=True).items() if id(v) not in own}

    first = training_only_weights()
    torch.rand(1000)  # another stage ran first in this process
    second = training_only_weights()
    assert first and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("labels, reason", [
    (["a"] * 30, "all 30 labelled documents have the label 'a'"),
    (["a", "b"] * 2, "only 4 labelled documents"),
])
def test_a_learning_curve_of_nothing_is_refused(labels, reason):
    docs = pa.table({"text": [f"text {i}" for i in range(len(labels))], "label": labels})
    with pytest.raises(InputError, match=f"train.eval_every: {reason}.*two labels or more"):
        knn_curve(None, docs, KnnConfig(k=3), 8)


def test_mntp_on_a_decoder_resumes_after_a_kill_bit_identically(tiny_decoder_dir, tmp_path):
    def mntp(folder, on_step=None):
        model = sentence_model(tiny_decoder_dir, CFG.max_length, bidirectional=True)
        history = train_model_on(build_objective(model, "mntp", CFG, 0.2, None), PAIRS, CFG, Checkpoints(folder),
                                 on_step=on_step)
        return model, history

    (straight, full), (resumed, rest) = straight_and_resumed(mntp, tmp_path / "a", tmp_path / "b")
    assert [h.loss for h in rest] == [h.loss for h in full]
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    untrained = weights(sentence_model(tiny_decoder_dir, CFG.max_length))
    assert not all(torch.equal(a[k], untrained[k]) for k in a)


def test_rungs_train_each_step_once_and_end_as_one_uninterrupted_run(demo, tiny_dir, monkeypatch):
    store, pairs = demo
    method, cfg = MethodConfig(name="crops", recipe="crops"), CFG.model_copy(update={"checkpoint_every": 100})
    ref = pairs("crops")
    tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, method, cfg), TokensInputs(pairs=ref))
    inputs = TrainInputs(pairs=ref, tokens=tokens)
    trained = []  # the steps each train job takes
    stepped = training.precision.MixedPrecision.step
    monkeypatch.setattr(training.precision.MixedPrecision, "step",
                        lambda self, *a: trained.__setitem__(-1, trained[-1] + 1) or stepped(self, *a))

    def train(until=None, resume=None) -> ArtifactRef:
        trained.append(0)
        job = TrainJob.for_method(tiny_dir, method, cfg, None).model_copy(update={"until": until})
        return TRAIN.run(store, job, inputs.model_copy(update={"resume": resume}))

    whole = train()
    steps = store.manifest(whole)["extra"]["steps"]
    first = train(until=3)
    second = train(until=7, resume=first)
    last = train(resume=second)
    assert steps > 7 and trained == [steps, 3, 4, steps - 7]  # every step once across the rungs
    assert [store.manifest(r)["extra"]["steps"] for r in (first, second, last)] == [3, 7, steps]
    assert (store.path(first) / STATE).is_file() and not (store.path(last) / STATE).exists()
    # the same steps, and the health probe at each rung's end too (it draws nothing: the same weights)
    rungs, once = (store.read_table(r, "training").drop_columns("probe_cosine").to_pylist() for r in (last, whole))
    assert rungs == once
    probed = store.read_table(last, "training").filter(pc.is_valid(pc.field("probe_cosine")))["step"].to_pylist()
    assert {3, 7} <= set(probed) and not {3, 7} & set(store.read_table(whole, "training").filter(
        pc.is_valid(pc.field("probe_cosine")))["step"].to_pylist())
    a = SentenceTransformer(str(store.path(whole) / "model")).state_dict()
    b = SentenceTransformer(str(store.path(last) / "model")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert len({whole, first, second, last}) == 4 and train(until=3) == first  # each rung cached as itself

    other = TrainJob.for_method(tiny_dir, method, cfg.model_copy(update={"lr": 2e-3}), None)
    with pytest.raises(InputError, match=f"{first.address}: not a rung of this training"):
        TRAIN.run(store, other, inputs.model_copy(update={"resume": first}))
    with pytest.raises(InputError, match=f"{second.address}: not a rung of this training"):
        train(until=5, resume=second)  # a rung past the step asked for
    with pytest.raises(InputError, match=f"{whole.address}: not a rung of this training"):
        train(resume=whole)  # a whole run keeps no state to go on from
    other_pairs = pairs("crops", epochs=1)
    other_tokens = TOKENS.run(store, TokensJob.for_method(tiny_dir, method, cfg), TokensInputs(pairs=other_pairs))
    with pytest.raises(InputError, match=f"{first.address}: not a rung of this training"):
        TRAIN.run(store, TrainJob.for_method(tiny_dir, method, cfg, None).model_copy(update={"until": 5}),
                  TrainInputs(pairs=other_pairs, tokens=other_tokens, resume=first))
