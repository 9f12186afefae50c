"""tasks/encoders/budget.py: one character budget for every path that tokenizes."""

from tasks.encoders.budget import char_budget, cut_texts, over_budget


def test_texts_over_the_budget_are_cut_and_counted_the_rest_kept_as_they_are():
    budget = char_budget(4)
    texts = ["a" * (budget + 1), "b" * budget, "short", "c" * (10 * budget)]
    cut, n = cut_texts(texts, 4), over_budget(texts, 4)
    assert n == 2
    assert cut == ["a" * budget, "b" * budget, "short", "c" * budget]
    assert cut[1] is texts[1] and cut[2] is texts[2]  # no copy of what fits
