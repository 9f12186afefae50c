import pyarrow as pa

from tasks.config import SentenceConfig
from tasks.pairs import Replacement, build_crops, crops_by_document, draw_pairs, draw_summary_pairs
from tasks.sentences import sentence_table


def s(ch, n=120):
    return ch * n


def test_crops_are_runs_of_n_kept_sentences_skipping_filtered_ones():
    # Fragment 2 is too short: the crop starting at A continues with C, as the reference code does.
    text = f"{s('A')}. {s('B')}. tiny. {s('C')}. {s('D', 300)}. {s('E')}."
    sentences = sentence_table(["doc"], [text], SentenceConfig())
    crops = crops_by_document(sentences, n=2)["doc"]
    a, b, c, e = (f"{s(x)}." for x in "ABCE")
    assert crops == [f"{a} {b}", f"{b} {c}", f"{c} {e}"]
    assert build_crops([a, b, c], 3) == [f"{a} {b} {c}"]
    assert build_crops([a, b], 3) == []


def test_documents_with_fewer_than_two_crops_are_dropped():
    doc_crops = {"one": ["c1"], "two": ["c1", "c2"], "none": []}
    for view in ("crops", "same", "noise"):
        assert set(draw_pairs(doc_crops, view, epochs=1, seed=0)["doc_id"].to_pylist()) == {"two"}


def test_pairs_one_per_document_per_epoch_distinct_for_crops_same_for_dropout():
    doc_crops = {f"d{i}": [f"d{i}-c{j}" for j in range(3)] for i in range(50)}
    crops = draw_pairs(doc_crops, "crops", epochs=3, seed=1).to_pylist()
    dropout = draw_pairs(doc_crops, "same", epochs=3, seed=1).to_pylist()
    for rows in (crops, dropout):
        for epoch in range(3):
            docs = [r["doc_id"] for r in rows if r["epoch"] == epoch]
            assert sorted(docs) == sorted(doc_crops)  # every document once: never twice in a batch
        assert all(r["anchor"].startswith(r["doc_id"] + "-") and r["positive"].startswith(r["doc_id"] + "-")
                   for r in rows)
    assert all(r["anchor"] != r["positive"] for r in crops)
    assert all(r["anchor"] == r["positive"] for r in dropout)
    orders = [[r["doc_id"] for r in crops if r["epoch"] == e] for e in range(3)]
    assert orders[0] != orders[1]  # reshuffled each epoch


def test_pairs_are_seeded():
    doc_crops = {f"d{i}": [f"c{j}" for j in range(4)] for i in range(20)}
    assert draw_pairs(doc_crops, "crops", 2, seed=5) == draw_pairs(doc_crops, "crops", 2, seed=5)
    assert draw_pairs(doc_crops, "crops", 2, seed=5) != draw_pairs(doc_crops, "crops", 2, seed=6)
    assert isinstance(draw_pairs(doc_crops, "crops", 1, 0), pa.Table)


def test_noise_view_pairs_a_word_deleted_crop_with_the_crop_itself():
    doc_crops = {f"d{i}": [" ".join(f"w{i}_{j}_{k}" for k in range(20)) for j in range(3)] for i in range(30)}
    rows = draw_pairs(doc_crops, "noise", epochs=2, seed=0, deletion_ratio=0.6).to_pylist()
    for r in rows:
        kept, original = r["anchor"].split(), r["positive"].split()
        assert original in [c.split() for c in doc_crops[r["doc_id"]]]
        assert 1 <= len(kept) < len(original) and [w for w in original if w in kept] == kept  # order kept
    # Each epoch draws new noise for the same document.
    first = {r["doc_id"]: r["anchor"] for r in rows if r["epoch"] == 0}
    assert sum(first[r["doc_id"]] != r["anchor"] for r in rows if r["epoch"] == 1) > 25


def test_held_out_pairs_leave_out_exactly_the_knn_test_documents():
    from sklearn.model_selection import train_test_split

    from tasks.pairs import HeldOut, knn_test_documents

    ids = [f"d{i}" for i in range(30)]
    docs = pa.table({"doc_id": ids, "label": [None if i % 5 == 0 else str(i % 3) for i in range(30)]})
    labelled = [d for i, d in enumerate(ids) if i % 5]
    _, test = train_test_split(labelled, test_size=0.2, random_state=7)  # the kNN metric's own split
    assert knn_test_documents(docs, HeldOut(test_size=0.2, seed=7)) == set(test)


def _summary_views(replacement, epochs=400):
    summaries = {f"d{i}": [f"summary {i}.{j}" for j in range(4)] for i in range(5)}
    titles = {f"d{i}": f"title {i}" for i in range(5)}
    sentences = {f"d{i}": [f"sentence {i}.{j}" for j in range(3)] for i in range(5)}
    return summaries, draw_summary_pairs(summaries, titles, sentences, replacement, epochs, seed=0).to_pandas()


def test_semcse_positives_replaced_by_title_15_and_a_sentence_35_percent_of_the_time():
    summaries, pairs = _summary_views(Replacement(title_rate=0.15, sentence_rate=0.35, same_input=False))
    assert len(pairs) == 5 * 400 and (pairs.groupby("epoch")["doc_id"].nunique() == 5).all()
    share = pairs["positive_kind"].value_counts(normalize=True)
    # 2,000 draws: the binomial standard error of a 15% share is 0.8 points.
    assert abs(share["title"] - 0.15) < 0.025 and abs(share["sentence"] - 0.35) < 0.035
    assert abs(share["summary"] - 0.50) < 0.035
    doc = pairs["doc_id"].str[1]
    assert all(a in summaries[f"d{d}"] for a, d in zip(pairs["anchor"], doc))  # anchors: always summaries
    kind = pairs["positive_kind"]
    assert (pairs.loc[kind == "title", "positive"] == "title " + doc[kind == "title"]).all()
    assert pairs.loc[kind == "sentence", "positive"].str.startswith("sentence ").all()
    own = pairs[kind == "summary"]
    assert (own["positive"] != own["anchor"]).all()  # another summary of the same document
    assert (own["positive"].str.split(".").str[0] == own["anchor"].str.split(".").str[0]).all()


def test_semcse_same_input_ablation_repeats_the_anchor():
    _, pairs = _summary_views(Replacement(title_rate=0.15, sentence_rate=0.35, same_input=True), epochs=3)
    assert (pairs["positive"] == pairs["anchor"]).all() and set(pairs["positive_kind"]) == {"same"}


def test_semcse_documents_need_two_usable_summaries():
    pairs = draw_summary_pairs({"a": ["one"], "b": ["x", "y"]}, {}, {}, Replacement(
        title_rate=0, sentence_rate=0, same_input=False), epochs=2, seed=0)
    assert set(pairs["doc_id"].to_pylist()) == {"b"}
