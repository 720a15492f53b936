"""scripts/constrained_diffusion_eval.py: every task's answers are in its grammar, and the evaluation's
tallies on an untrained character diffusion LM."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from warpdecode.data.parallel_tasks import EVAL_SEED, TASKS, TaskExample, example
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.models.checkpoint import load_pretrained

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "constrained_diffusion_eval.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("constrained_diffusion_eval", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dlm(dlm_dir):
    """The session's untrained masked diffusion LM over the task alphabet (conftest `dlm_dir`)."""
    model, tokenizer = load_pretrained(dlm_dir)
    return model.eval(), tokenizer


def test_every_reference_answer_is_in_its_grammar(script) -> None:
    examples = [example(task, seed, i) for task in TASKS for seed in (EVAL_SEED, 0) for i in range(500)]
    script.check_references(examples)  # the Python regex of each format


def test_the_compiled_grammar_takes_the_reference_answers_and_nothing_longer(script, dlm) -> None:
    model, tokenizer = dlm
    eos = tokenizer.eos_token_id
    for task in TASKS:
        for i in range(5):
            ex = example(task, EVAL_SEED, i)
            grammar = compile_response_format(script.task_format(ex)[0], tokenizer, vocab_size=model.config.vocab_size,
                                              stop_ids={eos})
            state = grammar.state()
            ids = tokenizer.encode(ex.answer)
            assert state.advance(ids) == len(ids) and state.is_accepting(), ex
            if task in ("copy", "reverse", "perm", "fill"):  # the payload's length: one more character is out
                assert not state.allows(tokenizer.encode(ex.answer[-1])[0]), ex


@pytest.mark.parametrize(("task", "payload", "wrong"), [
    ("add", "12+3", "015"), ("add", "9999+9999", "199980"), ("sort", "3918", "1398"), ("sort", "3918", ""),
    ("close", "([", "]("), ("copy", "ab1", "ab2"), ("reverse", "abc", "cbaa"), ("perm", "abc", "abd"),
    ("fill", "d_f", "dxg"),
])
def test_wrong_formats_are_outside_the_grammar(script, task: str, payload: str, wrong: str) -> None:
    assert not script.in_grammar(TaskExample(task, payload, ""), wrong)


def test_evaluate_tallies_free_and_constrained(script, dlm) -> None:
    model, tokenizer = dlm
    examples = [example(task, EVAL_SEED, i) for i in range(2) for task in TASKS]
    policies = ["fixed:eot_stop=true", "threshold:threshold=0.5:eot_stop=true"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script runs: one prompt at a time, two threads only contend
    try:
        tallies = script.evaluate(model, tokenizer, examples, policies)
    finally:
        torch.set_num_threads(threads)
    assert {label for label, _ in tallies} == set(policies)
    for (_, task), tally in tallies.items():
        free, constrained = tally[False], tally[True]
        assert free.examples == constrained.examples == 2
        assert 1 <= constrained.steps <= 2 * 16 and constrained.seconds > 0
        if task not in ("sort", "close"):  # bounded grammars end inside the region: every answer valid
            assert constrained.valid == 2, task
    lines = script.table(tallies)
    assert len(lines) == 2 + len(policies) * (len(TASKS) + 1)
    assert all(line.count("|") == 10 for line in lines)
