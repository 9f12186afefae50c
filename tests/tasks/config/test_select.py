"""tasks/config/select.py: the `select` section, its default candidates and its rungs' arithmetic."""

import pytest
from pydantic import ValidationError

from tasks.config.recipes import RECIPES
from tasks.config.select import DEFAULT_CANDIDATES, SelectConfig, rung_steps


def test_the_default_candidates_are_those_whose_view_the_config_can_build():
    select = SelectConfig()
    assert select.candidate_recipes(summaries=False, queries=False) == ["crops", "dropout", "tsdae"]
    assert select.candidate_recipes(summaries=True, queries=False) == ["crops", "dropout", "tsdae", "semcse"]
    assert select.candidate_recipes(summaries=True, queries=True) == list(DEFAULT_CANDIDATES)
    assert all(RECIPES[r].needs is None for r in select.candidate_recipes(False, False))  # the registry decides
    assert SelectConfig(recipes=["mlm"]).candidate_recipes(False, False) == ["mlm"]  # named: as named
    assert ("crops, dropout, tsdae, with semcse when the config has `summaries` and gpl, inpars when it has "
            "`queries`; from a decoder LLM, llm2vec in place of dropout and tsdae") in SelectConfig.model_fields[
        "recipes"].description


def test_a_decoder_s_default_candidates_have_llm2vec_in_place_of_dropout_and_tsdae():
    select = SelectConfig()
    assert select.candidate_recipes(False, False, decoder=True) == ["llm2vec", "crops"]
    assert select.candidate_recipes(True, True, decoder=True) == ["llm2vec", "crops", "semcse", "gpl", "inpars"]
    assert SelectConfig(recipes=["crops"]).candidate_recipes(False, False, decoder=True) == ["crops"]  # as named


def test_a_candidate_is_a_recipe_or_a_chain_once():
    with pytest.raises(ValidationError, match="unknown recipes"):
        SelectConfig(recipes=["nope"])
    assert SelectConfig(recipes=["llm2vec", "crops"]).candidate_recipes(False, False) == ["llm2vec", "crops"]
    with pytest.raises(ValidationError, match="at least 1 item"):  # unset means the defaults; empty is a mistake
        SelectConfig(recipes=[])
    with pytest.raises(ValidationError, match="recipes must differ"):
        SelectConfig(recipes=["crops", "crops"])
    with pytest.raises(ValidationError, match="learning rates must be positive and differ"):
        SelectConfig(lrs=[1e-4, 1e-4])


def test_rungs_are_eta_apart_and_below_the_budget():
    assert rung_steps(900, 9, 3) == [100, 300]
    assert rung_steps(100, 9, 3) == [11, 33]  # multiples of the first: the pruner's rungs exactly
    assert rung_steps(100, 10, 3) == [3, 9, 27]  # a tenth candidate: one more halving
    assert rung_steps(100, 2, 2) == [50]
    assert rung_steps(100, 1, 3) == []
    assert rung_steps(4, 9, 3) == [1, 3]
    with pytest.raises(ValueError, match=r"a budget of 3 steps is too small for 9 candidates at eta 3: its rungs "
                                         r"\(1, 3 steps\) must stay below it; at least 4 steps"):
        rung_steps(3, 9, 3)
    with pytest.raises(ValueError, match="at least 1 step"):
        rung_steps(0, 9, 3)
