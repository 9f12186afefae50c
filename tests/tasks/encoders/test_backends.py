"""ONNX Runtime and OpenVINO encode what torch encodes; their int8 variants come close."""

import shutil

import numpy as np
import pandas as pd
import pytest

from storage.store import ArtifactStore
from tasks.config.evaluation import EvaluateConfig
from tasks.embed import EMBED, EmbedInputs, EmbedJob, read_embeddings
from tasks.encoders import backends
from tasks.encoders.encode import PooledEncoder
from tests.helpers import DEMO_DOCS, tiny_encoder

TEXTS = pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(24).tolist() + ["short", "a b"]


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("tiny") / "model", dropout=0.1)


@pytest.fixture(scope="module")
def torch_vectors(encoder_folder):
    return PooledEncoder(encoder_folder, "cpu").encode_layers(TEXTS, max_length=64, batch_size=8)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_backend_gives_torchs_vectors_for_every_pooling(backend, encoder_folder, torch_vectors):
    # Batches of mixed lengths: padded positions must be masked out as in torch.
    vectors = PooledEncoder(encoder_folder, "cpu", backend=backend).encode_layers(TEXTS, max_length=64, batch_size=8)
    assert vectors.shape == torch_vectors.shape  # (1 layer, 3 poolings, texts, dim)
    np.testing.assert_allclose(vectors, torch_vectors, atol=1e-5)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_int8_variant_is_close_but_not_the_same(backend, encoder_folder, torch_vectors, tmp_path):
    vectors = PooledEncoder(encoder_folder, "cpu", backend=backend, quantized=True).encode(TEXTS, 64, 8)
    reference = torch_vectors[0, 0]
    cosines = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() > 0.98
    assert not np.allclose(vectors, reference, atol=1e-5)  # it really ran the int8 model


def test_exported_files_are_where_sentence_transformers_looks(encoder_folder, tmp_path):
    onnx_file = backends.backend_file(encoder_folder, "onnx", tmp_path)
    assert onnx_file == tmp_path / "onnx" / "model.onnx"
    openvino = backends.backend_file(encoder_folder, "openvino", tmp_path)
    assert openvino == tmp_path / "openvino" / "openvino_model.xml" and openvino.with_suffix(".bin").is_file()


def test_a_folder_with_an_onnx_file_is_run_as_it_is(encoder_folder, tmp_path):
    folder = tmp_path / "exported"
    shutil.copytree(encoder_folder, folder)
    backends.export_onnx(str(folder), folder / backends.FILES["onnx"])
    assert backends.backend_file(str(folder), "onnx", tmp_path / "unused") == folder / "onnx" / "model.onnx"
    assert not (tmp_path / "unused").exists()


def test_embed_stage_key_follows_the_backend_and_vectors_do_not(encoder_folder, tmp_path):
    store = ArtifactStore(tmp_path / "store")
    # fp32: the backends agree to 1e-5 in it (`auto` is bf16 on a CPU with native bf16, to ~1e-2)
    jobs = {b: EmbedJob(model=encoder_folder, pairs_path=str(DEMO_DOCS.parent / "stsb.parquet"), split="test",
                        max_length=64, batch_size=32, device="cpu", backend=b, dtype="fp32")
            for b in ("torch", "openvino")}
    refs = {b: EMBED.ref(job, EmbedInputs()) for b, job in jobs.items()}
    assert refs["torch"].key != refs["openvino"].key
    for backend, job in jobs.items():
        EMBED.run(store, job, EmbedInputs())
    np.testing.assert_allclose(read_embeddings(store, refs["openvino"], "mean"),
                               read_embeddings(store, refs["torch"], "mean"), atol=1e-5)
    assert {store.manifest(ref)["extra"]["computed_in"] for ref in refs.values()} == {"float32"}  # as asked


@pytest.mark.parametrize(("fields", "message"), [
    ({"backend": "onnx", "layerwise": True}, "backend: onnx gives the last layer only"),
    ({"backend": "openvino", "layerwise": True}, "backend: openvino gives the last layer only"),
    ({"backend": "onnx", "dtype": "bf16"}, "backend: onnx encodes in fp32"),
    ({"backend": "openvino", "device": "cuda"}, "backend: openvino runs on the CPU"),
])
def test_backend_settings_that_cannot_work_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        EvaluateConfig(**fields)
    EvaluateConfig(backend="openvino", dtype="bf16")  # OpenVINO runs bf16 on a CPU
