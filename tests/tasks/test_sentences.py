from tasks.config import SentenceConfig
from tasks.sentences import sentence_table, split_blingfire

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
