"""tasks/views/summaries.py: SemCSE's rows from LLM summaries, titles and sentences."""

from tasks.views.summaries import Replacement, draw_summary_pairs


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
