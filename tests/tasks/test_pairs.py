import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from storage.store import ArtifactStore
from tasks import pairs as pairs_module
from tasks.config.base import InputError
from tasks.config.data import DataConfig, SentenceConfig
from tasks.config.training import TrainConfig, epoch_batches
from tasks.core.held_out import HeldOut, knn_test_documents
from tasks.core.stage import NoInputs
from tasks.ingest import INGEST
from tasks.methods.batches import plan_batches
from tasks.pairs import PAIRS, PairsConfig, PairsInputs
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.views import crops as crops_module
from tasks.views.noise import deletion_mask, keep_words
from tests.helpers import DEMO_DOCS


def sentence(doc, j, n=120):
    """A sentence the paper's splitter keeps (100-250 characters), recognisable by its start."""
    return f"{doc}s{j} ".ljust(n, "x") + "."


def crop(doc, first, n=2):
    return " ".join(sentence(doc, j) for j in range(first, first + n))


def drawn_pairs(root, corpus, view, epochs=1, seed=0, n=2, held_out=None, steps=None, min_rows=None,
                **data) -> list[dict]:
    """The pairs artifact of `corpus` (a Parquet file, or doc_id → text) built by the real stages."""
    root.mkdir(parents=True, exist_ok=True)
    if isinstance(corpus, dict):
        path = root / "docs.parquet"
        pd.DataFrame({"doc_id": list(corpus), "text": list(corpus.values())}).to_parquet(path)
        corpus, data = path, {"columns": {"title": None, "label": None, "split": None}}
    store = ArtifactStore(root / "store")
    docs = INGEST.run(store, DataConfig(path=str(corpus), **data), NoInputs())
    sentences = SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=docs))
    cfg = PairsConfig(view=view, n_sentences=n, seed=seed, epochs=epochs, held_out=held_out,
                      deletion_ratio=0.6 if view == "noise" else None, steps=steps, batch_size=4 if steps else None,
                      min_rows=min_rows)
    pairs = PAIRS.run(store, cfg, PairsInputs.for_view(cfg, sentences, docs, None))
    return store.read_table(pairs, "pairs").to_pylist()


def test_crops_are_runs_of_n_kept_sentences_skipping_filtered_ones(tmp_path):
    # Fragment 2 is too short: the crop starting at sentence 1 continues with 3, as the reference code does.
    text = " ".join([sentence("a", 1), sentence("a", 2), "tiny.", sentence("a", 3), sentence("a", 4, 300),
                     sentence("a", 5)])
    corpus = {"a": text, "b": " ".join(sentence("b", j) for j in range(4))}  # a run needs 2 documents
    ends = {" ".join(sentence("a", j) for j in js) for js in [(1, 2), (2, 3), (3, 5)]}
    assert {r["anchor"] for r in drawn_pairs(tmp_path / "2", corpus, "same", epochs=80) if r["doc_id"] == "a"} == ends
    three = {" ".join(sentence("a", j) for j in js) for js in [(1, 2, 3), (2, 3, 5)]}
    assert {r["anchor"] for r in drawn_pairs(tmp_path / "3", corpus, "same", epochs=40, n=3)
            if r["doc_id"] == "a"} == three


@pytest.mark.parametrize("view", ["crops", "same", "noise"])
def test_documents_with_fewer_than_two_crops_are_dropped(tmp_path, view):
    corpus = {"one": " ".join(sentence("one", j) for j in range(2)),  # 1 crop
              "two": " ".join(sentence("two", j) for j in range(3)),  # 2 crops
              "three": " ".join(sentence("three", j) for j in range(4)),  # 3 crops
              "none": "Too short. All of it."}
    assert {r["doc_id"] for r in drawn_pairs(tmp_path, corpus, view, epochs=2)} == {"two", "three"}


def test_no_document_with_two_crops_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no document has 2 or more crops: check sentences.min_chars"):
        drawn_pairs(tmp_path, {"a": "Short. Texts. Only.", "b": "Also. Short."}, "crops")


def test_a_view_of_one_row_per_epoch_is_refused_before_training(tmp_path):
    corpus = {"one": " ".join(sentence("one", j) for j in range(3)), "none": "Too short. All of it."}
    with pytest.raises(InputError, match=r"the crops view made 1 row\(s\) per epoch from the corpus; training needs "
                                         r"at least 2 \(a batch's in-batch negatives\)"):
        drawn_pairs(tmp_path, corpus, "crops", epochs=3)
    assert not list((tmp_path / "store" / "artifacts").glob("pairs/*"))


def _corpus(docs=50, sentences=4):
    return {f"d{i:02d}": " ".join(sentence(f"d{i:02d}", j) for j in range(sentences)) for i in range(docs)}


def test_pairs_one_per_document_per_epoch_distinct_for_crops_same_for_dropout(tmp_path):
    corpus = _corpus()
    crops = drawn_pairs(tmp_path / "crops", corpus, "crops", epochs=3, seed=1)
    dropout = drawn_pairs(tmp_path / "same", corpus, "same", epochs=3, seed=1)
    for rows in (crops, dropout):
        for epoch in range(3):
            docs = [r["doc_id"] for r in rows if r["epoch"] == epoch]
            assert sorted(docs) == sorted(corpus)  # every document once: never twice in a batch
        assert all(r["anchor"] in {crop(r["doc_id"], k) for k in range(3)} and
                   r["positive"] in {crop(r["doc_id"], k) for k in range(3)} for r in rows)
    assert all(r["anchor"] != r["positive"] for r in crops)
    assert all(r["anchor"] == r["positive"] for r in dropout)
    orders = [[r["doc_id"] for r in crops if r["epoch"] == e] for e in range(3)]
    assert orders[0] != orders[1]  # reshuffled each epoch


@pytest.mark.parametrize("steps, epochs", [(3, 1), (4, 2), (9, 3), (1, 1)])
def test_a_step_budget_makes_as_many_epochs_as_it_takes(tmp_path, steps, epochs):
    """10 documents in batches of 4 make 3 batches an epoch (4, 4, 2): `steps` batches need ceil(steps / 3) epochs,
    as many as the train stage's plan (tasks/methods/batches.py) will find in the file."""
    rows = drawn_pairs(tmp_path, _corpus(10, 3), "crops", steps=steps)
    assert max(r["epoch"] for r in rows) + 1 == epochs
    per_epoch = [sum(r["epoch"] == e for r in rows) for e in range(epochs)]
    assert len(plan_batches(per_epoch, 4)) >= steps > len(plan_batches(per_epoch[:-1], 4))


def test_epoch_batches_counts_what_the_plan_cuts():
    for rows in range(0, 40):
        for batch in (2, 3, 4, 16):  # train.batch_size >= 2
            assert epoch_batches(rows, batch) == len(plan_batches([rows], batch)), (rows, batch)
            for devices in [d for d in (2, 3, "auto") if d == "auto" or d <= batch]:  # full batches only then
                train = TrainConfig(batch_size=batch, devices=devices)
                assert train.min_batch_rows == batch
                assert (epoch_batches(rows, batch, train.min_batch_rows) == rows // batch ==
                        len(plan_batches([rows], batch, min_rows=train.min_batch_rows))), (rows, batch, devices)


def test_a_step_budget_in_several_processes_counts_full_batches_only(tmp_path):
    """10 documents in batches of 4: one process trains on 3 batches an epoch (4, 4, 2), several on 2 (each process
    holds rows of every batch), so 5 steps take 2 epochs or 3, as many as the train stage's plan will find."""
    for devices, epochs in ((1, 2), (2, 3), (3, 3)):
        train = TrainConfig(batch_size=4, devices=devices)
        rows = drawn_pairs(tmp_path / str(devices), _corpus(10, 3), "crops", steps=5, min_rows=train.min_batch_rows)
        assert max(r["epoch"] for r in rows) + 1 == epochs
        per_epoch = [sum(r["epoch"] == e for r in rows) for e in range(epochs)]
        assert len(plan_batches(per_epoch, 4, min_rows=train.min_batch_rows)) >= 5


def test_pairs_are_seeded(tmp_path):
    corpus = _corpus(20, 5)
    first, again = (drawn_pairs(tmp_path / name, corpus, "crops", 2, seed=5) for name in ("a", "b"))
    assert first == again
    assert first != drawn_pairs(tmp_path / "c", corpus, "crops", 2, seed=6)


def test_noise_view_pairs_a_word_deleted_crop_with_the_crop_itself(tmp_path):
    corpus = {f"d{i}": " ".join(" ".join(f"w{i}_{j}_{k}" for k in range(20)) + "." for j in range(3))
              for i in range(30)}
    rows = drawn_pairs(tmp_path, corpus, "noise", epochs=2, seed=0)
    for r in rows:
        kept, original = r["anchor"].split(), r["positive"].split()
        assert len(original) == 40 and original[0].startswith(f"w{r['doc_id'][1:]}_")
        assert 1 <= len(kept) < len(original) and [w for w in original if w in kept] == kept  # order kept
    # Each epoch draws new noise for the same document.
    first = {r["doc_id"]: r["anchor"] for r in rows if r["epoch"] == 0}
    assert sum(first[r["doc_id"]] != r["anchor"] for r in rows if r["epoch"] == 1) > 25


def in_memory_pairs(sentences: pa.Table, cfg: PairsConfig, test: set[str]) -> list[dict]:
    """The rule written plainly, every document's crops in a dict (the stage before it streamed):
    the oracle the streamed stage must equal row for row."""
    crops: dict[str, list[str]] = {}
    kept = sentences.filter(sentences["kept"]).sort_by([("doc_id", "ascending"), ("position", "ascending")])
    texts: dict[str, list[str]] = {}
    for doc, text in zip(kept["doc_id"].to_pylist(), kept["text"].to_pylist()):
        texts.setdefault(doc, []).append(text)
    n = cfg.n_sentences
    crops = {d: [" ".join(t[i : i + n]) for i in range(len(t) - n + 1)] for d, t in texts.items() if d not in test}
    docs = [d for d, c in crops.items() if len(c) >= 2]
    rng, rows = np.random.default_rng(cfg.seed), []
    for epoch in range(cfg.epochs):
        for i in rng.permutation(len(docs)):
            own = crops[docs[i]]
            a, b = rng.choice(len(own), size=2, replace=False) if cfg.view == "crops" else [rng.integers(len(own))] * 2
            anchor = own[a]
            if cfg.view == "noise":
                anchor = keep_words(anchor, deletion_mask(len(anchor.split()), cfg.deletion_ratio, rng))
            rows.append(dict(epoch=epoch, doc_id=docs[i], anchor=anchor, positive=own[b]))
    return rows


@pytest.mark.parametrize("view, n, held_out", [("crops", 2, None), ("same", 2, None), ("noise", 2, None),
                                               ("crops", 3, HeldOut(test_size=0.1, seed=42))])
def test_streamed_pairs_equal_the_in_memory_rule_on_the_demo_corpus(tmp_path, monkeypatch, view, n, held_out):
    monkeypatch.setattr(pairs_module, "ROWS_PER_GROUP", 97)  # many row groups: every boundary is crossed
    monkeypatch.setattr(crops_module, "READ_ROWS", 101)  # a document's sentences cut across read batches
    rows = drawn_pairs(tmp_path, DEMO_DOCS, view, epochs=2, seed=3, n=n, held_out=held_out, limit=400)
    store = ArtifactStore(tmp_path / "store")
    (sentences,) = store.artifacts("sentences")
    cfg = PairsConfig(view=view, n_sentences=n, seed=3, epochs=2, held_out=held_out,
                      deletion_ratio=0.6 if view == "noise" else None)
    test = knn_test_documents(store.read_table(store.artifacts("ingest")[0], "documents"),
                              held_out) if held_out else set()
    expected = in_memory_pairs(store.read_table(sentences, "sentences"), cfg, test)
    assert rows == expected and len(rows) > 500 and not {r["doc_id"] for r in rows} & test
