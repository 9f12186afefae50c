"""tasks/static.py: a static model distilled from a model of the run with model2vec (and trained on the corpus's
sentences with tokenlearn) loads in model2vec and sentence-transformers with the same vectors, and the
embed stage encodes it as they do; bad settings are one error naming the field."""

import logging

import numpy as np
import pytest
from model2vec import StaticModel
from sentence_transformers import SentenceTransformer

from storage.store import ArtifactStore
from tasks import static
from tasks.config.base import InputError
from tasks.config.data import DataConfig, SentenceConfig
from tasks.config.evaluation import SemanticConfig
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.encoders.encode import POOLINGS, PooledEncoder, encoder_at, is_static
from tasks.ingest import INGEST
from tasks.semantic import SEMANTIC, SemanticInputs, SemanticJob
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.speed import SPEED, SpeedInputs, SpeedJob
from tasks.static import STATIC, StaticInputs, StaticJob, corpus_sentences
from tests.helpers import DEMO_DOCS

log = logging.getLogger("test")
TEXTS = ["Aspirin lowers the risk of a second heart attack.", "A man is playing a guitar.", "Insulin and diabetes."]


DOCS = DataConfig(path=str(DEMO_DOCS), limit=150)


def sentences_in(store: ArtifactStore):
    docs = INGEST.run(store, DOCS, NoInputs())
    return SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=docs))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    store = ArtifactStore(tmp_path_factory.mktemp("static") / "store")
    return store, sentences_in(store)


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


def test_a_stage_killed_while_featurizing_resumes_from_the_pool_to_the_same_table(tmp_path, tiny_dir, monkeypatch):
    """The teacher's vectors go to the store's pool a slice at a time: a failed stage keeps the slices done, the
    rerun encodes only the others and makes the table an uninterrupted run makes; other settings reuse them all."""
    monkeypatch.setattr(static, "FEATURIZE_SHARD", 128)  # 300 sentences: slices of 128, 128 and 44
    encoded, real = [], PooledEncoder.encode

    def encode(self, texts, *args):
        if len(encoded) == 1 and fail:
            raise RuntimeError("killed")
        encoded.append(len(texts))
        return real(self, texts, *args)

    monkeypatch.setattr(PooledEncoder, "encode", encode)
    store = ArtifactStore(tmp_path / "store")
    job, inputs = StaticJob(model=tiny_dir, pca_dims=16, sentences=300), StaticInputs(sentences=sentences_in(store))
    fail = True
    with pytest.raises(RuntimeError, match="killed"):
        STATIC.run(store, job, inputs)
    assert encoded == [128] and not list((store.root / "artifacts").glob("static/*"))
    fail = False
    ref = STATIC.run(store, job, inputs)
    assert encoded == [128, 128, 44]  # the first slice was read from the pool
    other = ArtifactStore(tmp_path / "other")  # an uninterrupted run, pool and all, elsewhere
    uninterrupted = STATIC.run(other, job, StaticInputs(sentences=sentences_in(other)))
    assert uninterrupted.key == ref.key and encoded == [128, 128, 44, 128, 128, 44]
    tables = [StaticModel.from_pretrained(str(s.path(r) / "model")).embedding
              for s, r in ((store, ref), (other, uninterrupted))]
    np.testing.assert_array_equal(*tables)
    assert STATIC.run(store, job.model_copy(update={"pca_dims": 8}), inputs) != ref
    assert len(encoded) == 6  # another table from the same teacher's vectors: no sentence encoded again
    monkeypatch.setattr(static, "code_version", lambda module: "edited")  # the encoder's code changed
    STATIC.run(store, job.model_copy(update={"pca_dims": 4}), inputs)
    assert encoded[6:] == [128, 128, 44]  # its vectors are not trusted: made again


def test_the_speed_stage_times_the_static_model_and_its_teacher_in_turn(corpus, tiny_dir):
    store, sentences = corpus
    made = STATIC.run(store, StaticJob(model=tiny_dir, pca_dims=16, tokenlearn=False),
                      StaticInputs(sentences=sentences))
    job = SpeedJob(teacher=tiny_dir, dataset="demo", documents=40, max_length=64, batch_size=16, rounds=2)
    ref = SPEED.run(store, job, SpeedInputs(static=made, documents=INGEST.run(store, DOCS, NoInputs())))
    rows = store.read_table(ref, "metrics").to_pandas().set_index("metric")
    assert list(rows.index) == ["cpu_docs_per_s", "teacher_cpu_docs_per_s"]
    assert (rows["value"] > 0).all() and set(rows["n"]) == {40} and set(rows["repeats"]) == {2}
    assert set(rows["model"]) == {made.address} and set(rows["dataset"]) == {"demo"}
    rounds = store.manifest(ref)["extra"]["rounds"]
    assert [len(r) for r in rounds.values()] == [2, 2]
    assert SPEED.run(store, job, SpeedInputs(static=made, documents=INGEST.run(store, DOCS, NoInputs()))) == ref


def test_the_semantic_benchmark_encodes_titles_and_halves_with_the_static_model(corpus, tiny_dir):
    """The semantic stage reads the static model's document vectors and encodes the rest through model2vec."""
    store, sentences = corpus
    made = STATIC.run(store, StaticJob(model=tiny_dir, pca_dims=16, tokenlearn=False),
                      StaticInputs(sentences=sentences))
    docs = INGEST.run(store, DOCS, NoInputs())
    embedded = EMBED.run(store, EmbedJob(max_length=64, batch_size=16), EmbedInputs(model=made, documents=docs))
    ref = SEMANTIC.run(store, SemanticJob(label="static", dataset="demo", semantic=SemanticConfig(limit=50),
                                          max_length=64, batch_size=16),
                       SemanticInputs(documents=docs, embeddings=embedded, model=made))
    rows = store.read_table(ref, "metrics").to_pandas().set_index("metric")
    assert {"semantic_rank_title_abstract", "semantic_rank_halves", "semantic_same_label_5nn"} <= set(rows.index)
    assert rows.loc["semantic_rank_halves", "value"] < 25  # of 50: better than chance, the halves found
    assert set(rows["layer"]) == {0} and set(rows["model"]) == {made.address}
