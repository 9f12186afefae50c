"""tasks/static.py: a static model distilled from a model of the run with model2vec (and trained on the corpus's
sentences with tokenlearn) loads in model2vec and sentence-transformers with the same vectors, and the
embed stage encodes it as they do; bad settings are one error naming the field."""

import logging

import numpy as np
import pytest
from model2vec import StaticModel
from sentence_transformers import SentenceTransformer

from storage.store import ArtifactStore
from tasks.config.base import InputError
from tasks.config.data import DataConfig, SentenceConfig
from tasks.core.stage import NoInputs
from tasks.encoders.encode import POOLINGS, PooledEncoder, encoder_at, is_static
from tasks.ingest import INGEST
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.static import STATIC, StaticInputs, StaticJob, corpus_sentences
from tests.helpers import DEMO_DOCS

log = logging.getLogger("test")
TEXTS = ["Aspirin lowers the risk of a second heart attack.", "A man is playing a guitar.", "Insulin and diabetes."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    store = ArtifactStore(tmp_path_factory.mktemp("static") / "store")
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=150), NoInputs())
    return store, SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=docs))


def test_a_distilled_model_loads_in_both_libraries_and_embeds_as_they_do(corpus, tiny_dir):
    store, sentences = corpus
    job = StaticJob(model=tiny_dir, pca_dims=16, tokenlearn=False)
    ref = STATIC.run(store, job, StaticInputs(sentences=sentences))
    folder = str(store.path(ref) / "model")
    assert is_static(folder) and not is_static(tiny_dir)
    loaded = StaticModel.from_pretrained(folder)
    model2vec = loaded.encode(TEXTS)
    assert model2vec.shape == (3, 16) and loaded.embedding.dtype == np.float16  # model2vec's own default
    np.testing.assert_allclose(SentenceTransformer(folder).encode(TEXTS), model2vec, atol=1e-3)  # sums in fp16
    encoder = encoder_at(folder)
    assert (encoder.n_layers, encoder.dim, encoder.tokenizer) == (0, 16, None)
    layers = encoder.encode_layers(TEXTS)  # (layers, poolings, texts, dim): its one vector under every pooling
    assert layers.shape == (1, len(POOLINGS), 3, 16)
    for pooling in range(len(POOLINGS)):
        np.testing.assert_allclose(layers[0, pooling], model2vec, atol=1e-6)
    vocabulary = loaded.embedding.shape[0]  # MiniLM's 30,522 tokens less its [unused] ones, which model2vec drops
    assert 29_000 < vocabulary < 30_522
    assert store.manifest(ref)["extra"] == dict(teacher=tiny_dir, vocabulary=vocabulary, dim=16, sentences=0)
    assert STATIC.run(store, job, StaticInputs(sentences=sentences)) == ref and STATIC.cached(store, ref, log)


def test_tokenlearn_trains_the_table_on_the_teacher_s_vectors_of_the_corpus(corpus, tiny_dir):
    store, sentences = corpus
    plain = STATIC.run(store, StaticJob(model=tiny_dir, pca_dims=16, tokenlearn=False),
                       StaticInputs(sentences=sentences))
    job = StaticJob(model=tiny_dir, pca_dims=16, sentences=300, corpus_words=100)
    trained = STATIC.run(store, job, StaticInputs(sentences=sentences))
    assert trained != plain
    extra = store.manifest(trained)["extra"]
    assert extra["sentences"] == 300 and extra["dim"] == 16
    assert extra["vocabulary"] > store.manifest(plain)["extra"]["vocabulary"]  # the corpus's words were added
    texts = corpus_sentences(store, sentences, 300)
    teacher = PooledEncoder(tiny_dir).encode(texts, 256, 64)
    # What it learned: to place the sentences as the teacher does. Their cosine similarities, pair by pair,
    # follow the teacher's more closely than those of the plain distillation.
    def agreement(ref) -> float:
        x = StaticModel.from_pretrained(str(store.path(ref) / "model")).encode(texts)
        return float(np.corrcoef(cosines(x), cosines(teacher))[0, 1])
    assert agreement(trained) > agreement(plain)


def cosines(x: np.ndarray) -> np.ndarray:
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    return (u @ u.T)[np.triu_indices(len(u), 1)]


@pytest.mark.parametrize("job, said", [
    (dict(pca_dims=64), "static.pca_dims: 64 is more than the teacher's 32 dimensions"),
    (dict(pca_dims=16, sentences=10), "static.tokenlearn: the corpus has 10 kept sentences, fewer than the 16"),
    (dict(model="no-such-org/no-such-model"), "model 'no-such-org/no-such-model': not a local folder"),
])
def test_bad_settings_are_one_error_naming_the_field(corpus, tiny_dir, job, said):
    store, sentences = corpus
    with pytest.raises(InputError, match=said):
        STATIC.run(store, StaticJob(**{"model": tiny_dir, **job}), StaticInputs(sentences=sentences))
