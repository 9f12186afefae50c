"""Fixtures of the stage tests."""

import pytest

from storage.store import ArtifactStore
from tasks.config.data import DataConfig, SentenceConfig
from tasks.config.training import MethodConfig
from tasks.core.stage import NoInputs
from tasks.ingest import INGEST
from tasks.pairs import PAIRS, PairsConfig, PairsInputs
from tasks.sentences import SENTENCES, SentencesInputs
from tests.helpers import DEMO_DOCS


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A store with 60 demo documents' sentences, and a function building a method's pairs in it."""
    store = ArtifactStore(tmp_path_factory.mktemp("tokens") / "store")
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=60), NoInputs())
    sentences = SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=docs))

    def pairs(recipe: str, epochs: int = 2):
        view = PairsConfig.for_method(MethodConfig(name=recipe, recipe=recipe), epochs=epochs)
        return PAIRS.run(store, view, PairsInputs.for_view(view, sentences, docs, None))

    return store, pairs
