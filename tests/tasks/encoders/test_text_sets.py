"""tasks/encoders/text_sets.py: reading the first texts of a table without reading all of it."""

import pyarrow as pa
import pyarrow.parquet as pq

from storage.base import ArtifactRef
from storage.store import ArtifactStore
from tasks.encoders.text_sets import first_texts


def test_first_texts_reads_row_groups_only_as_far_as_the_limit(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path)
    ref = ArtifactRef("sentences", "k")
    groups = [pa.table({"text": [f"t{g}{i}" for i in range(4)], "kept": [True, False, True, True]}) for g in range(5)]
    with store.writing(ref, config={}, inputs=[], code_version="v", libraries={}) as out:
        out.write_batches("sentences", groups[0].schema, groups)  # a row group per batch
    assert first_texts(store, ref, "sentences", 4, kept="kept") == ["t00", "t02", "t03", "t10"]
    assert first_texts(store, ref, "sentences", 3) == ["t00", "t01", "t02"]
    assert len(first_texts(store, ref, "sentences", 100, kept="kept")) == 15
    read = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, g, **kw: read.append(g) or real(self, g, **kw))
    first_texts(store, ref, "sentences", 5)
    assert read == [0, 1]  # the last three row groups are never read
