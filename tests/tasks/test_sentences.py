import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.store import ArtifactStore
from tasks import sentences
from tasks.config.data import DEMO_DOCS, DataConfig, SentenceConfig
from tasks.core.stage import NoInputs
from tasks.ingest import INGEST
from tasks.sentences import SENTENCES, SentencesInputs, sentence_table, split_blingfire

LONG = "x" * 120


def test_paper_split_filters_on_length_before_strip():
    # " " + 99 chars is 100 before stripping: kept, as in the reference code.
    text = f"{LONG}. {'y' * 99}. short. {'z' * 251}. "
    table = sentence_table(["d"], [text], SentenceConfig()).to_pylist()
    assert [r["length"] for r in table] == [120, 100, 6, 252, 1]
    assert [r["kept"] for r in table] == [True, True, False, False, False]
    assert table[1]["text"] == "y" * 99 + "."  # stripped, full stop restored
    assert [r["position"] for r in table] == [0, 1, 2, 3, 4]


def test_blingfire_keeps_abbreviations_and_decimals_inside_sentences():
    text = "Rates fell (p < 0.05) in treated rats, e.g. in the liver. A second sentence follows."
    assert split_blingfire(text) == ["Rates fell (p < 0.05) in treated rats, e.g. in the liver.",
                                     "A second sentence follows."]



def split_corpus(root, sentences: SentenceConfig) -> pa.Table:
    """The sentences artifact of the demo corpus's first 300 documents, built in its own store."""
    store = ArtifactStore(root)
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=300), NoInputs())
    return store.read_table(SENTENCES.run(store, sentences, SentencesInputs(documents=docs)), "sentences")


@pytest.mark.parametrize("splitter", ["paper", "blingfire"])
def test_a_corpus_split_in_many_batches_by_two_workers_gives_the_one_batch_table(tmp_path, monkeypatch, splitter):
    one = split_corpus(tmp_path / "one", SentenceConfig(splitter=splitter))
    monkeypatch.setattr(sentences, "BATCH_ROWS", 32)  # 10 batches, in 2 worker processes
    many = split_corpus(tmp_path / "many", SentenceConfig(splitter=splitter, workers=2))
    assert many.equals(one) and one.num_rows > 1000
    assert pq.ParquetFile(tmp_path / "many" / "artifacts" / "sentences" / os.listdir(
        tmp_path / "many" / "artifacts" / "sentences")[0] / "sentences.parquet").num_row_groups == 10
