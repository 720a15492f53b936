"""GSM8K answer scoring of a bench run: last number of each output, against the references and greedy."""

from __future__ import annotations

import pytest

from warpdecode.bench.answers import final_number, gsm8k_references, markdown, score_answers
from warpdecode.errors import ConfigError


@pytest.mark.parametrize("text, number", [
    ("She makes 9 * 2 = $18 every day.", "18"), ("The total is $1,200.00.", "1200"), ("It is -3.50", "-3.5"),
    ("no digits here", None), ("2 apples and 3.0 pears", "3"),
])
def test_final_number(text, number):
    assert final_number(text) == number


def test_rows_are_scored_against_references_and_the_greedy_row():
    texts = {1: "so 18", 2: "so 5", 3: "so 17", 4: "no answer"}
    measurements = [{"row": row, "prompt_id": f"gsm8k/test-{p}", "token_ids": [t]}
                    for row, outputs in (("none", (1, 2)), ("lossy", (3, 2)), ("other", (4, 4)))
                    for p, t in zip((0, 1), outputs, strict=True)]
    scores = score_answers({"measurements": measurements}, lambda ids: texts[ids[0]], {"gsm8k/test-0": "18",
                                                                                        "gsm8k/test-1": "3"})
    assert scores == [{"row": "none", "prompts": 2, "accuracy": 0.5, "agreement": 1.0},
                      {"row": "lossy", "prompts": 2, "accuracy": 0.0, "agreement": 0.5},
                      {"row": "other", "prompts": 2, "accuracy": 0.0, "agreement": 0.0}]
    assert "| `lossy` | 2 | 0.0 % | 50.0 % |" in markdown(scores)


def test_runs_without_gsm8k_references_or_a_baseline_are_refused():
    with pytest.raises(ConfigError, match="no GSM8K reference"):
        score_answers({"measurements": [{"row": "none", "prompt_id": "spec_bench/x", "token_ids": [1]}]}, str, {})
    with pytest.raises(ConfigError, match="no 'none' row"):
        score_answers({"measurements": [{"row": "a", "prompt_id": "p", "token_ids": [1]}]}, str, {"p": "1"})


def test_references_are_the_numbers_after_the_marker():
    references = gsm8k_references()
    assert references["gsm8k/test-0"] == "18" and len(references) > 1000
