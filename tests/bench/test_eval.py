"""`warpdecode eval` on a tiny random model over a small fake HumanEval / GSM8K folder: the samples,
their scores, the cost columns and the JSON; and the scoring of fixed texts."""

from __future__ import annotations

import gzip
import json

import pytest

from warpdecode import commands
from warpdecode.bench.eval import EvalConfig, GSM8KTask, HumanEvalTask, diversity
from warpdecode.data.gsm8k import gsm8k_problems
from warpdecode.data.humaneval import humaneval_problems
from warpdecode.errors import ConfigError

HUMANEVAL = [
    {"task_id": "Fake/0", "prompt": "def one():\n", "canonical_solution": "    return 1\n",
     "test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "one"},
    {"task_id": "Fake/1", "prompt": "def two():\n", "canonical_solution": "    return 2\n",
     "test": "def check(candidate):\n    assert candidate() == 2\n", "entry_point": "two"},
]
GSM8K = [{"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"},
         {"question": "What is 3 * 3?", "answer": "3 * 3 = 9\n#### 9"}]


@pytest.fixture
def datasets(tmp_path, monkeypatch):
    (tmp_path / "humaneval").mkdir()
    with gzip.open(tmp_path / "humaneval" / "HumanEval.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(row) + "\n" for row in HUMANEVAL)
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in GSM8K))
    monkeypatch.setenv("WARPDECODE_DATASETS", str(tmp_path))
    return tmp_path


def test_humaneval_scores_completions_in_the_sandbox(datasets):
    task = HumanEvalTask(EvalConfig(task="humaneval", timeout=2, workers=3))
    problem = humaneval_problems()[0]
    scores = task.score(problem, ["    return 1\n\ndef unrelated():\n    pass", "    return 2\n", "    while True:\n        pass"])
    assert [(scored, correct) for scored, correct, _ in scores] == [("    return 1\n", True), ("    return 2\n", False),
                                                                    ("    while True:\n        pass", False)]
    assert scores[1][2] == "failed: AssertionError" and scores[2][2].startswith(("timeout", "killed"))


def test_gsm8k_scores_the_extracted_answer(datasets):
    task = GSM8KTask(EvalConfig(task="gsm8k"))
    scores = task.score(gsm8k_problems()[0], ["2 + 2 = 4. The answer is 4.", "It is 5", "no idea"])
    assert scores == [("4", True, "expected 4"), ("5", False, "expected 4"), ("", False, "expected 4")]


@pytest.mark.parametrize("task", ["humaneval", "gsm8k"])
def test_eval_runs_every_sample_and_sums_its_cost(datasets, tiny_model_dir, tmp_path, capsys, task):
    out = tmp_path / "results.json"
    commands.eval(task=task, model=str(tiny_model_dir), max_new_tokens=6, temperature=1.0, num_return_sequences=3,
                  seed=5, output=out, threads=1, workers=3)
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    samples = [s for p in result["problems"] for s in p["samples"]]
    summary = result["summary"]
    assert [p["id"] for p in result["problems"]] == (["Fake/0", "Fake/1"] if task == "humaneval"
                                                     else ["gsm8k/test-0", "gsm8k/test-1"])
    assert [s["seed"] for s in samples] == [5, 6, 7, 8, 9, 10]
    assert summary["tokens"] == sum(s["new_tokens"] for s in samples) and 0 < summary["tokens"] <= 36
    assert summary["target_forwards"] == sum(s["target_forwards"] for s in samples)
    assert summary["accuracy"] == sum(s["correct"] for s in samples) / 6
    if task == "humaneval":
        assert set(summary["pass@k"]) == {"1", "3"} and result["sandbox"]
        assert summary["pass@1"] == pytest.approx(summary["accuracy"])
    assert f"| {task} | `none` | 2 × 3 |" in printed
    assert result["config"]["chat"] is None and result["config"]["num_return_sequences"] == 3
    if task == "humaneval":
        return
    # the same seeds give the same samples
    commands.eval(task=task, model=str(tiny_model_dir), max_new_tokens=6, temperature=1.0, num_return_sequences=3,
                  seed=5, output=tmp_path / "again.json", threads=1, workers=3)
    again = json.loads((tmp_path / "again.json").read_text())
    assert [s["text"] for p in again["problems"] for s in p["samples"]] == [s["text"] for s in samples]


def test_greedy_eval_with_a_method(datasets, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "greedy.json"
    commands.eval(task="gsm8k", model=str(tiny_model_dir), method="prompt_lookup", max_new_tokens=5, limit=1,
                  output=out, threads=1)
    result = json.loads(out.read_text())
    assert result["summary"]["problems"] == 1 and result["summary"]["method"] == "prompt_lookup"
    assert result["problems"][0]["samples"][0]["seed"] is None
    assert "| gsm8k | `prompt_lookup` | 1 × 1 |" in capsys.readouterr().out


def test_diversity_of_samples():
    same = diversity([["a b c d e", "a b c d e"]])
    assert same["self_bleu_4"] == pytest.approx(1.0) and same["distinct_2"] == pytest.approx(4 / 8)
    single = diversity([["a b c"], ["a b d"]])
    assert single["self_bleu_4"] is None and single["distinct_2"] == pytest.approx(3 / 4)


@pytest.mark.parametrize("options, message", [
    ({"task": "mmlu"}, "--task"),
    ({"task": "gsm8k", "num_return_sequences": 2}, "--temperature > 0"),
    ({"task": "gsm8k", "limit": 0}, "--limit"),
    ({"task": "humaneval", "timeout": 0}, "--timeout"),
    ({"task": "gsm8k", "scorer": "public_tests"}, "--scorer"),
    ({"task": "gsm8k", "offset": -1}, "--offset"),
    ({"task": "humaneval", "scorer": "hidden_tests"}, "--scorer"),
])
def test_bad_configurations_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        EvalConfig(**options)


@pytest.mark.slow
def test_humaneval_on_the_real_model_completes_the_raw_prompt(smollm2):
    """The completion protocol: greedy decoding of the raw prompt (no chat template), cut at a stop
    sequence, and every generated token counted."""
    from warpdecode.bench.eval import run_eval
    from warpdecode.data.humaneval import truncate_completion
    from warpdecode.decoding.generate import generate

    config = EvalConfig(task="humaneval", limit=1, max_new_tokens=16)
    result = run_eval(smollm2.model, smollm2.tokenizer, "none", config, model_name="smollm2", emit=lambda line: None)
    (sample,) = result.problems[0].samples
    problem = humaneval_problems(limit=1)[0]
    expected = generate(smollm2.model, smollm2.tokenizer, problem.prompt, max_new_tokens=16, chat=False)
    assert sample.text == expected.text and sample.scored == truncate_completion(expected.text)
    assert (sample.new_tokens, sample.target_forwards) == (len(expected.token_ids), expected.stats.target_forwards)
    assert result.summary()["pass@1"] == float(sample.correct) and result.sandbox


def test_humaneval_completions_stop_at_the_stop_sequences_and_chat_replies_do_not():
    from warpdecode.data.humaneval import STOP_SEQUENCES

    assert HumanEvalTask(EvalConfig(task="humaneval")).stop == STOP_SEQUENCES
    assert HumanEvalTask(EvalConfig(task="humaneval", chat=True)).stop == ()
    assert GSM8KTask(EvalConfig(task="gsm8k")).stop == ()


@pytest.mark.parametrize("options", [{"method": "best_of_n:n=2", "temperature": 1.0, "seed": 3},
                                     {"num_beams": 2}])
def test_eval_takes_a_search_strategy_or_beams(datasets, tiny_model_dir, tmp_path, options):
    out = tmp_path / "search.json"
    commands.eval(task="humaneval", model=str(tiny_model_dir), max_new_tokens=4, limit=1, output=out, threads=1,
                  **options)
    result = json.loads(out.read_text())
    (sample,) = result["problems"][0]["samples"]
    assert result["summary"]["method"] == options.get("method", "none + num_beams=2")
    assert result["config"]["num_beams"] == options.get("num_beams", 1)
    assert 0 < sample["new_tokens"] <= 2 * 4 and result["summary"]["tokens"] == sample["new_tokens"]  # every row's


def test_public_tests_scorer_ranks_by_the_examples_then_by_probability():
    from warpdecode.bench.eval import PublicTestsScorer
    from warpdecode.data.humaneval import HumanEvalProblem
    from warpdecode.decoding.outputs import Candidate

    problem = HumanEvalProblem("T/0", 'def sq(x):\n    """\n    >>> sq(2)\n    4\n    >>> sq(3)\n    9\n    """\n',
                               "def check(candidate):\n    assert False\n", "sq", "")
    task = HumanEvalTask(EvalConfig(task="humaneval", timeout=2, workers=2))
    texts = ["    return x * x\n", "    return x + x\n", "    return x ** 2\n", "    return 4\n"]
    candidates = [Candidate([1] * 4, "eos", logprob=lp, text=t) for t, lp in zip(texts, [-8.0, -1.0, -4.0, -2.0], strict=True)]
    scores = PublicTestsScorer(task, problem).score([0], candidates)
    assert [round(s, 2) for s in scores] == [1.0, 0.5, 1.0, 0.5]  # the hidden test (assert False) is never run
    assert sorted(range(4), key=lambda i: -scores[i]) == [2, 0, 1, 3]  # ties: the likelier first


def test_eval_ranks_a_search_with_the_tasks_scorer(datasets, tiny_model_dir, tmp_path):
    out = tmp_path / "scored.json"
    commands.eval(task="humaneval", model=str(tiny_model_dir), max_new_tokens=4, limit=1, output=out, threads=1,
                  method="best_of_n:n=3", temperature=1.0, seed=2, scorer="public_tests")
    result = json.loads(out.read_text())
    assert result["config"]["scorer"] == "public_tests" and len(result["problems"][0]["samples"]) == 1
    with pytest.raises(ConfigError, match="--scorer ranks a search"):
        commands.eval(task="humaneval", model=str(tiny_model_dir), max_new_tokens=4, limit=1, threads=1,
                      scorer="public_tests")


def test_eval_runs_pg_td_with_the_public_tests_as_its_reward(datasets, tiny_model_dir, tmp_path):
    out = tmp_path / "pg_td.json"
    commands.eval(task="humaneval", model=str(tiny_model_dir), max_new_tokens=6, limit=2, output=out, threads=1,
                  method="pg_td:k=2:max_rollouts=3:max_tokens=12", scorer="public_tests")
    result = json.loads(out.read_text())
    samples = [s for p in result["problems"] for s in p["samples"]]
    assert len(samples) == 2 and all(0 < s["new_tokens"] <= 12 for s in samples)  # the rollouts' tokens


def test_eval_runs_a_decoding_rule_per_problem(datasets, tiny_model_dir, tmp_path):
    out = tmp_path / "uscd.json"
    commands.eval(task="humaneval", model=str(tiny_model_dir), method="uscd:threshold=1.0", max_new_tokens=4, limit=2,
                  output=out, threads=1)
    result = json.loads(out.read_text())
    assert result["summary"]["method"] == "uscd:threshold=1.0"
    assert [len(p["samples"]) for p in result["problems"]] == [1, 1]
    assert all(0 < s["new_tokens"] <= 4 for p in result["problems"] for s in p["samples"])


def test_eval_takes_a_decoding_rule(datasets, tiny_model_dir, tmp_path):
    """A rule that never pauses (AdaDec at an infinite threshold) gives greedy's samples."""
    texts = {}
    for method in ("none", "adadec:threshold=inf"):
        out = tmp_path / f"{method}.json"
        commands.eval(task="humaneval", model=str(tiny_model_dir), max_new_tokens=6, limit=2, output=out, threads=1,
                      method=method)
        result = json.loads(out.read_text())
        assert result["summary"]["method"] == method
        texts[method] = [p["samples"][0]["text"] for p in result["problems"]]
    assert texts["adadec:threshold=inf"] == texts["none"]


def test_offset_and_limit_take_a_slice_of_the_set(datasets):
    assert [p.task_id for p in HumanEvalTask(EvalConfig(task="humaneval", offset=1)).problems()] == ["Fake/1"]
    assert [p.question for p in GSM8KTask(EvalConfig(task="gsm8k", offset=0, limit=1)).problems()] == ["What is 2 + 2?"]
    with pytest.raises(ConfigError, match="--offset 2 is past"):
        HumanEvalTask(EvalConfig(task="humaneval", offset=2)).problems()
