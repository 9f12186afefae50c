import json
import logging
import re

import pandas as pd
import pyarrow as pa
import pytest

from storage.store import ArtifactStore
from tasks import ingest
from tasks.config.base import InputError
from tasks.config.data import DataConfig
from tasks.core.stage import NoInputs
from tasks.ingest import INGEST

ROWS = [dict(doc_id="a", title="T1", text="First text.", label="x", split="train"),
        dict(doc_id="b", title="T2", text="Second text.", label="y", split="test"),
        dict(doc_id="c", title=None, text="Third text.", label=None, split=None)]


def cfg(path, **kw):
    return DataConfig(path=str(path), **kw)


@pytest.fixture
def load_documents(tmp_path_factory):
    def published(data: DataConfig) -> pd.DataFrame:
        """The documents artifact the ingest stage publishes, as a frame."""
        store = ArtifactStore(tmp_path_factory.mktemp("store"))
        documents = store.read_table(INGEST.run(store, data, NoInputs()), "documents")
        return pd.DataFrame(documents.to_pylist(), dtype=object)

    return published


@pytest.mark.parametrize("suffix", ["parquet", "csv", "jsonl"])
def test_every_format_gives_the_same_table(tmp_path, suffix, load_documents):
    frame = pd.DataFrame(ROWS)
    path = tmp_path / f"docs.{suffix}"
    if suffix == "parquet":
        frame.to_parquet(path)
    elif suffix == "csv":
        frame.to_csv(path, index=False)
    else:
        path.write_text("\n".join(json.dumps(r) for r in ROWS))
    docs = load_documents(cfg(path))
    assert docs.to_dict("records") == ROWS


def test_folder_of_files_and_column_mapping(tmp_path, load_documents):
    renamed = pd.DataFrame(ROWS).rename(columns={"doc_id": "pmid", "text": "abstract"})
    renamed.iloc[:2].to_csv(tmp_path / "a.csv", index=False)
    renamed.iloc[2:].to_parquet(tmp_path / "b.parquet")
    docs = load_documents(cfg(tmp_path, columns={"id": "pmid", "text": "abstract"}))
    assert docs["doc_id"].tolist() == ["a", "b", "c"]


def test_a_corpus_is_keyed_by_its_bytes_and_name_not_by_its_folder(tmp_path):
    """The same file moved or copied to another folder is the same ingest artifact, served from the store; other
    bytes, or another name (the one reports give the corpus), make another."""
    store = ArtifactStore(tmp_path / "store")
    here, there = tmp_path / "a" / "docs.csv", tmp_path / "b" / "docs.csv"
    for path in (here, there):
        path.parent.mkdir()
        pd.DataFrame(ROWS).to_csv(path, index=False)
    built = INGEST.run(store, cfg(here), NoInputs())
    made = store.manifest(built)["created_at"]
    assert INGEST.run(store, cfg(there), NoInputs()) == built
    assert store.manifest(built)["created_at"] == made  # not built again
    assert store.manifest(built)["config"]["path"] == str(here)  # the manifest says which file it read
    renamed = tmp_path / "b" / "other.csv"
    renamed.write_bytes(here.read_bytes())
    assert INGEST.ref(cfg(renamed), NoInputs()) != built
    pd.DataFrame(ROWS[:2]).to_csv(there, index=False)
    assert INGEST.ref(cfg(there), NoInputs()) != built


def test_missing_file(tmp_path, load_documents):
    with pytest.raises(InputError, match="data.path: .*nope.parquet does not exist"):
        load_documents(cfg(tmp_path / "nope.parquet"))


def test_missing_or_misnamed_column_names_file_and_field(tmp_path, load_documents):
    path = tmp_path / "docs.parquet"
    pd.DataFrame(ROWS).rename(columns={"text": "body"}).to_parquet(path)
    with pytest.raises(InputError) as err:
        load_documents(cfg(path))
    assert str(path) in str(err.value) and "'text' (data.columns.text) not found" in str(err.value)
    assert "body" in str(err.value)  # says what the file does have


def test_empty_text_names_the_row(tmp_path, load_documents):
    path = tmp_path / "docs.csv"
    pd.DataFrame([*ROWS[:2], dict(doc_id="z", title="", text="   ", label="x", split="")]).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"docs.csv: 1 row\(s\) with empty text .* row\(s\) \[3\]"):
        load_documents(cfg(path))


def test_non_utf8_names_the_line(tmp_path, load_documents):
    path = tmp_path / "docs.csv"
    path.write_bytes(b"doc_id,text\na,fine\nb,caf\xe9 latin-1\n")
    with pytest.raises(InputError, match=r"docs.csv: line 3: not valid UTF-8"):
        load_documents(cfg(path, columns={"title": None, "label": None, "split": None}))


def test_duplicate_ids_name_both_rows(tmp_path, load_documents):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [*ROWS, {**ROWS[0], "text": "again"}]))
    with pytest.raises(InputError, match=r"duplicate doc_id 'a' .*docs.jsonl row 1, .*docs.jsonl row 4"):
        load_documents(cfg(path))


@pytest.mark.parametrize("name, write", [
    ("docs.csv", lambda path: path.write_text("doc_id,title,text,label,split\n")),  # a header only
    ("docs.parquet", lambda path: pd.DataFrame(ROWS).iloc[:0].to_parquet(path)),
    ("docs.csv", lambda path: path.write_text("")),  # not even a header
    ("docs.jsonl", lambda path: path.write_text("\n\n")),
])
def test_an_empty_corpus_is_refused_naming_the_file_and_nothing_is_published(tmp_path, name, write):
    path = tmp_path / name
    write(path)
    store = ArtifactStore(tmp_path / "store")
    with pytest.raises(InputError, match=re.escape(f"{path}: 0 rows, no documents to ingest")):
        INGEST.run(store, cfg(path), NoInputs())
    assert not (store.root / "artifacts").exists() and not (store.root / ".tmp").exists()


@pytest.mark.parametrize("rows, said", [
    (ROWS[:1], "1 document; a run needs at least 2 (a batch's in-batch negatives, the evaluation's pairs of "
               "documents)"),
    ([{**r, "text": "The same text."} for r in ROWS], "all 3 documents have the same text; a run needs at least 2 "
                                                      "different texts"),
    ([{**r, "text": str(i)} for i, r in enumerate(ROWS)], "column 'text' (data.columns.text) holds only numbers (the "
                                                          "first: '0'), not text: is it the text column?"),
])
def test_a_corpus_that_cannot_make_a_run_is_refused_saying_what_it_has_and_needs(tmp_path, rows, said):
    path = tmp_path / "docs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    store = ArtifactStore(tmp_path / "store")
    with pytest.raises(InputError, match=re.escape(f"{path}: {said}")):
        INGEST.run(store, cfg(path), NoInputs())
    assert not (store.root / "artifacts").exists() and not (store.root / ".tmp").exists()


def test_a_csv_with_a_byte_order_mark_reads_its_first_column_by_name(tmp_path, load_documents):
    path = tmp_path / "docs.csv"
    pd.DataFrame(ROWS).to_csv(path, index=False, encoding="utf-8-sig")  # what spreadsheet programs save
    assert path.read_bytes().startswith(b"\xef\xbb\xbfdoc_id")
    assert load_documents(cfg(path)).to_dict("records") == ROWS


def test_a_folder_of_empty_files_is_refused_an_empty_file_among_others_adds_nothing(tmp_path, load_documents):
    pd.DataFrame(ROWS).iloc[:0].to_parquet(tmp_path / "a.parquet")
    (tmp_path / "b.csv").write_text("doc_id,text\n")
    with pytest.raises(InputError, match=re.escape(f"{tmp_path} (2 files): 0 rows, no documents to ingest")):
        load_documents(cfg(tmp_path))
    pd.DataFrame(ROWS).to_parquet(tmp_path / "c.parquet")
    assert load_documents(cfg(tmp_path)).to_dict("records") == ROWS


def test_limit_keeps_the_first_documents(tmp_path, load_documents):
    path = tmp_path / "docs.parquet"
    pd.DataFrame(ROWS).to_parquet(path)
    assert load_documents(cfg(path, limit=2))["doc_id"].tolist() == ["a", "b"]


def test_datasets_name_or_local_path(tmp_path, load_documents):
    folder = tmp_path / "hf"
    folder.mkdir()
    pd.DataFrame(ROWS).to_parquet(folder / "train.parquet")
    docs = load_documents(DataConfig(hf_dataset=str(folder), hf_split="train"))
    assert docs.to_dict("records") == ROWS


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(ingest, "BATCH_ROWS", 4)


def _many_rows(n=23, bad=None):
    return [dict(doc_id=f"d{i}", title=None, text="" if i == bad else f"text {i}", label=str(i % 3), split=None)
            for i in range(1, n + 1)]


def _write(rows, path):
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path, row_group_size=5)
    elif path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path.write_text("\n".join(json.dumps(r) for r in rows))


@pytest.mark.parametrize("suffix", ["parquet", "csv", "jsonl"])
def test_a_file_read_in_many_batches_gives_the_table_of_one_batch(tmp_path, suffix, load_documents, monkeypatch):
    path = tmp_path / f"docs.{suffix}"
    _write(_many_rows(), path)
    whole = load_documents(cfg(path))
    monkeypatch.setattr(ingest, "BATCH_ROWS", 4)
    assert load_documents(cfg(path)).equals(whole) and len(whole) == 23
    assert load_documents(cfg(path, limit=10))["doc_id"].tolist() == [f"d{i}" for i in range(1, 11)]


@pytest.mark.parametrize("suffix", ["parquet", "csv", "jsonl"])
def test_a_bad_row_deep_in_a_many_batch_file_is_named_by_its_row(tmp_path, suffix, small_batches, load_documents):
    path = tmp_path / f"docs.{suffix}"
    _write(_many_rows(bad=19), path)
    with pytest.raises(InputError, match=re.escape(f"{path}: 1 row(s) with empty text (column 'text'), "
                                                   "first at row(s) [19]")):
        load_documents(cfg(path))


def test_a_duplicate_id_in_another_batch_and_file_names_both_rows(tmp_path, small_batches, load_documents):
    rows = _many_rows()
    _write(rows, tmp_path / "a.parquet")
    _write([*_many_rows(6)[1:], {**rows[20], "text": "again"}], tmp_path / "b.jsonl")  # d2..d6, then d21
    with pytest.raises(InputError, match=re.escape(f"duplicate doc_id 'd2' (12 rows share ids): "
                                                   f"{tmp_path / 'a.parquet'} row 2, {tmp_path / 'b.jsonl'} row 1")):
        load_documents(cfg(tmp_path))


def test_a_csv_row_with_too_many_fields_names_its_line(tmp_path, load_documents):
    path = tmp_path / "docs.csv"
    path.write_text('doc_id,text\na,"two\nlines"\nb,fine,extra\n')
    with pytest.raises(InputError, match=re.escape(f"{path}: line 4: 3 fields, the header has 2")):
        load_documents(cfg(path, columns={"title": None, "label": None, "split": None}))


def test_numbers_are_text_the_same_way_in_every_batch(tmp_path, small_batches, load_documents):
    # An integer label column with a null in one batch only must not become "1.0" there and "1" elsewhere.
    path = tmp_path / "docs.parquet"
    pa_rows = [dict(doc_id=i, text=f"t{i}", label=None if i == 6 else i % 2) for i in range(10)]
    pd.DataFrame(pa_rows).astype({"label": "Int64"}).to_parquet(path)
    docs = load_documents(cfg(path, columns={"title": None, "split": None}))
    assert docs["doc_id"].tolist() == [str(i) for i in range(10)]
    assert set(docs["label"].dropna()) == {"0", "1"} and docs["label"].isna().sum() == 1


def test_a_streamed_dataset_gives_the_same_documents(tmp_path, small_batches, load_documents):
    folder = tmp_path / "hf"
    folder.mkdir()
    pd.DataFrame(_many_rows()).to_parquet(folder / "train.parquet")
    data = DataConfig(hf_dataset=str(folder), hf_split="train")
    streamed = DataConfig(hf_dataset=str(folder), hf_split="train", streaming=True)
    assert load_documents(streamed).equals(load_documents(data))
    assert INGEST.ref(streamed, NoInputs()) == INGEST.ref(data, NoInputs())  # same documents, same artifact


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_a_default_column_the_file_lacks_is_left_out_and_ids_come_from_the_rows(tmp_path, suffix, load_documents):
    """A plain corpus (text, perhaps titles; no ids, labels or splits) is read as it is: what most people have."""
    frame = pd.DataFrame(ROWS)[["title", "text"]]
    path = tmp_path / f"docs.{suffix}"
    frame.to_parquet(path) if suffix == "parquet" else frame.to_csv(path, index=False)
    docs = load_documents(cfg(path))
    assert docs["doc_id"].tolist() == ["1", "2", "3"] and docs["title"].tolist() == ["T1", "T2", None]
    assert docs["label"].isna().all() and docs["split"].isna().all()
    folder = tmp_path / "folder"  # in a folder of several files, a row's id names its file
    folder.mkdir()
    frame.iloc[:2].to_csv(folder / "a.csv", index=False)
    frame.iloc[2:].to_parquet(folder / "b.parquet")
    assert load_documents(cfg(folder))["doc_id"].tolist() == ["a.csv:1", "a.csv:2", "b.parquet:1"]


def test_a_column_the_config_names_must_be_there(tmp_path, load_documents):
    path = tmp_path / "docs.parquet"
    pd.DataFrame(ROWS).drop(columns="label").to_parquet(path)
    assert load_documents(cfg(path))["label"].isna().all()  # the default: used if present
    with pytest.raises(InputError, match=r"column 'label' \(data.columns.label\) not found; the file has doc_id, "
                                         r"title, text, split$"):
        load_documents(cfg(path, columns={"label": "label"}))


def test_a_missing_text_column_says_how_to_name_it(tmp_path, load_documents):
    path = tmp_path / "docs.csv"
    pd.DataFrame(ROWS).rename(columns={"text": "body"}).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"'text' \(data.columns.text\) not found; the file has doc_id, title, body, "
                                         r"label, split; name the text's column with data.columns.text"):
        load_documents(cfg(path))


def test_a_folder_of_text_and_markdown_files_is_a_document_a_file(tmp_path, load_documents):
    (tmp_path / "notes").mkdir()
    (tmp_path / "a.txt").write_text("Plain text, no title.\nSecond line.")
    (tmp_path / "notes" / "b.md").write_text("\n# A heading\nThe body of b.")
    (tmp_path / "notes" / "c.md").write_text("No heading here.")
    (tmp_path / "empty.txt").write_text("  \n")  # adds nothing, as an empty table file
    docs = load_documents(cfg(tmp_path))
    assert docs.to_dict("records") == [
        dict(doc_id="a.txt", title=None, text="Plain text, no title.\nSecond line.", label=None, split=None),
        dict(doc_id="notes/b.md", title="A heading", text="The body of b.", label=None, split=None),
        dict(doc_id="notes/c.md", title=None, text="No heading here.", label=None, split=None)]
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    with pytest.raises(InputError, match=r"bad.txt: not valid UTF-8 \(byte 3\)"):
        load_documents(cfg(tmp_path))


def test_the_log_says_what_yardstick_the_corpus_allows(tmp_path, load_documents, caplog):
    pd.DataFrame(ROWS).to_parquet(tmp_path / "docs.parquet")
    pd.DataFrame(ROWS)[["doc_id", "text"]].to_parquet(tmp_path / "plain.parquet")
    with caplog.at_level(logging.INFO):
        load_documents(cfg(tmp_path / "docs.parquet"))
        load_documents(cfg(tmp_path / "plain.parquet"))
    assert "3 documents from docs: 2 with a title, 2 with a label (a yardstick can be made of their labels or " \
           "titles)" in caplog.text
    assert "3 documents from plain: 0 with a title, 0 with a label (no titles or labels: a yardstick can be made of " \
           "the texts alone (their clusters, an LLM's queries) or of your queries, `--qrels`)" in caplog.text


POST = ("In article <1993Apr5.1@host.edu>, someone@host.edu (Some One) writes:\n> a quoted line\n"
        "|> another\n: and a third\nWhat the poster wrote,\n  in two lines.\nMail me: me@site.org")


def test_a_post_is_stripped_of_its_attribution_quotes_and_addresses():
    assert ingest.strip_mail(POST, quotes=True) == "What the poster wrote, in two lines. Mail me:"
    assert ingest.strip_mail(POST) == "> a quoted line |> another : and a third What the poster wrote, in two lines. " \
                                      "Mail me:"
    assert ingest.strip_mail("> all quote", quotes=True) == "> all quote"  # nothing left: the post as it is


def test_an_attribution_line_is_counted_as_strip_mail_finds_it():
    texts = [POST, "Someone WROTE:  \nreply", "He said: yes, on one line.", "Text\nsays :", "Plain.", "A\nB said:"]
    assert ingest.attributed(pa.chunked_array([texts])) == 4 == sum(bool(ingest.ATTRIBUTION.search(t)) for t in texts)


def test_mail_boilerplate_is_counted_suggested_and_stripped_when_asked(tmp_path, load_documents, caplog):
    rows = [dict(doc_id="a", text=POST), dict(doc_id="b", text="A plain text.\n> with a quote"),
            *(dict(doc_id=f"p{i}", text=f"Plain text {i}.") for i in range(8))]
    pd.DataFrame(rows).to_parquet(tmp_path / "posts.parquet")
    with caplog.at_level(logging.INFO):
        as_is = load_documents(cfg(tmp_path / "posts.parquet"))
    assert as_is["text"].tolist() == [r["text"] for r in rows]
    assert "1 of the 10 documents carry a mail or forum attribution line" in caplog.text
    assert "data.strip_mail=true" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        senders = load_documents(cfg(tmp_path / "posts.parquet", strip_mail=True))
        stripped = load_documents(cfg(tmp_path / "posts.parquet", strip_mail=True, strip_quotes=True))
    assert senders["text"].tolist()[:3] == [ingest.strip_mail(POST), "A plain text. > with a quote", "Plain text 0."]
    assert stripped["text"].tolist()[:3] == ["What the poster wrote, in two lines. Mail me:", "A plain text.",
                                             "Plain text 0."]
    assert "who wrote stripped (data.strip_mail): 1 of them had an attribution line" in caplog.text
    assert "who wrote stripped (data.strip_mail, and quoted lines: data.strip_quotes): 1 of them" in caplog.text
    assert "carry a mail" not in caplog.text
    caplog.clear()
    with pytest.raises(ValueError, match="strip_quotes: removes quoted lines with `strip_mail`"):
        cfg(tmp_path / "posts.parquet", strip_quotes=True)
    fewer = rows[:1] + rows[2:] + [dict(doc_id=i, text=f"More plain text {i}.") for i in "qr"]  # one in eleven
    pd.DataFrame(fewer).to_parquet(tmp_path / "few.parquet")
    with caplog.at_level(logging.INFO):
        load_documents(cfg(tmp_path / "few.parquet"))
    assert "11 documents from few" in caplog.text and "carry a mail" not in caplog.text
