"""The device step decodes exactly what plain greedy decoding decodes, with the host engine's
accepted lengths for the same drafter, in its static (capturable) and eager CPU forms."""

from __future__ import annotations

import json

import pytest
from tiny_models import greedy_target

from warpdecode.decoding.device_step.loop import device_form, has_device_form, run_device
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import CapabilityError

METHODS = ["prompt_lookup", "token_recycling"]
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5], [9, 8, 7, 9, 8, 7, 9, 8, 7, 9, 8, 7, 9, 8], list(range(40, 64))]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


def plain(target, ids: list[int], n: int, stop: set[int]) -> list[int]:
    return run(target, ids, build_method("none"), Sampler(SamplingConfig()), max_new_tokens=n, stop_ids=stop)[0]


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_equals_plain_greedy_and_the_engine(target, method: str, static: bool) -> None:
    """One drafter per side across the prompts: Token Recycling's matrix carries over between requests."""
    host, device = build_method(method), build_method(method)
    accepted = 0
    for ids in PROMPTS:
        want = plain(target, ids, 48, set())
        engine_new, _, engine_stats = run(target, ids, host, Sampler(SamplingConfig()), max_new_tokens=48,
                                          stop_ids=set())
        new, finish, stats = run_device(target, ids, device_form(device.drafter), max_new_tokens=48, stop_ids=set(),
                                        static=static)
        assert new == want == engine_new and finish == "length"
        assert stats.accepted_per_step == engine_stats.accepted_per_step
        assert stats.proposed_per_step == engine_stats.proposed_per_step
        assert stats.target_forwards == engine_stats.target_forwards and stats.new_tokens == 48
        accepted += sum(stats.accepted_per_step)
    assert accepted > 10  # the drafts were really used


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
@pytest.mark.parametrize("method", METHODS)
def test_stops_at_max_new_tokens_and_at_a_stop_token(target, method: str, max_new: int) -> None:
    ids = PROMPTS[0]
    reference = plain(target, ids, 30, set())
    for stop in (set(), {reference[max_new // 2]}, {reference[12]}, {reference[0]}):
        want = plain(target, ids, max_new, stop)
        _, _, engine_stats = run(target, ids, build_method(method), Sampler(SamplingConfig()), max_new_tokens=max_new,
                                 stop_ids=stop)
        for static in (False, True):
            new, finish, stats = run_device(target, ids, device_form(build_method(method).drafter),
                                            max_new_tokens=max_new, stop_ids=stop, static=static)
            assert new == want
            assert finish == ("eos" if new[-1] in stop else "length")
            assert stats.accepted_per_step == engine_stats.accepted_per_step


@pytest.mark.parametrize("method", METHODS)
def test_reading_every_few_steps_changes_nothing(target, method: str) -> None:
    """Steps after the end are masked: the output and the logged steps stay as they were."""
    ids = PROMPTS[2]
    stop = {plain(target, ids, 20, set())[17]}
    want = run_device(target, ids, device_form(build_method(method).drafter), max_new_tokens=40, stop_ids=stop,
                      static=True)
    got = run_device(target, ids, device_form(build_method(method).drafter), max_new_tokens=40, stop_ids=stop,
                     static=True, read_every=5)
    assert got[0] == want[0] and got[2].accepted_per_step == want[2].accepted_per_step


def test_generate_takes_the_device_step(target) -> None:
    ids = PROMPTS[0]
    for method in METHODS:
        want = generate(target, None, ids, max_new_tokens=24, method=method)
        out = generate(target, None, ids, max_new_tokens=24, method=method, device_step=True)
        assert out.token_ids == want.token_ids and out.stats.accepted_per_step == want.stats.accepted_per_step


@pytest.mark.parametrize("static", [False, True])
def test_streams_what_it_returns(target, static: bool) -> None:
    streamed: list[int] = []
    new, _, _ = run_device(target, PROMPTS[2], device_form(build_method("prompt_lookup").drafter), max_new_tokens=30,
                           stop_ids=set(), static=static, read_every=3, on_tokens=streamed.extend)
    assert streamed == new


def test_refusals(target) -> None:
    assert has_device_form(build_method("prompt_lookup").drafter)
    assert not has_device_form(build_method("lookahead").drafter)
    with pytest.raises(CapabilityError, match="device step"):
        device_form(build_method("lookahead").drafter)
    with pytest.raises(CapabilityError, match="penalties"):
        generate(target, None, [1, 2], max_new_tokens=4, method="prompt_lookup", device_step=True,
                 repetition_penalty=1.2)
    with pytest.raises(CapabilityError, match="penalties"):
        generate(target, None, [1, 2], max_new_tokens=4, method="prompt_lookup", device_step=True, do_sample=True,
                 presence_penalty=0.5)
    adaptive = build_method("prompt_lookup", controller="adaptive")
    with pytest.raises(CapabilityError, match="fixed controller"):
        generate(target, None, [1, 2], max_new_tokens=4, method=adaptive, device_step=True)
    lossy = build_method("prompt_lookup", verifier="typical", do_sample=True)
    with pytest.raises(CapabilityError, match="lossless"):
        generate(target, None, [1, 2], max_new_tokens=4, method=lossy, device_step=True, do_sample=True)


def test_device_form_is_made_once_per_drafter() -> None:
    drafter = build_method("token_recycling").drafter
    assert device_form(drafter) is device_form(drafter)
    assert device_form(build_method("token_recycling").drafter) is not device_form(drafter)


def test_methods_json_says_which_methods_have_it(capsys) -> None:
    from warpdecode.commands import methods

    methods(json_output=True)
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows if r["device_step"]} == {"eagle", "hydra", "medusa", "oracle", "ppd", "prompt_lookup",
                                                                "token_recycling"}


def test_a_spec_with_step_device_runs_the_device_step(target) -> None:
    """`NAME:step=device` (generate --method, bench --methods, the server's speculation field) builds a
    method that `generate` runs in the device step: same tokens and accepted lengths as the engine."""
    from warpdecode.decoding.specs import device_step_drafters, parse_method
    from warpdecode.errors import ConfigError

    assert set(METHODS) <= set(device_step_drafters())
    for text in ("prompt_lookup:num_tokens=6", "token_recycling"):
        spec = parse_method(f"{text}:step=device")
        spec.validate()
        built = spec.build(do_sample=False)
        assert built.device_step and spec.label == f"{text}:step=device"
        want = generate(target, None, PROMPTS[2], max_new_tokens=24, method=parse_method(text).build(do_sample=False))
        out = generate(target, None, PROMPTS[2], max_new_tokens=24, method=built)
        assert out.token_ids == want.token_ids and out.stats.accepted_per_step == want.stats.accepted_per_step
    assert not parse_method("prompt_lookup:step=engine").build(do_sample=False).device_step
    with pytest.raises(ConfigError, match="step must be one of engine, device"):
        parse_method("prompt_lookup:step=gpu").validate()
    with pytest.raises(ConfigError, match="lookahead has no device form; step=device runs .*prompt_lookup"):
        parse_method("lookahead:step=device").validate()
    assert parse_method("prompt_lookup:step=device").build(do_sample=True).device_step  # samples losslessly
    with pytest.raises(CapabilityError, match="lossless"):
        parse_method("prompt_lookup:step=device:verifier=typical").build(do_sample=True)
    with pytest.raises(CapabilityError, match="fixed controller"):
        parse_method("prompt_lookup:step=device:controller=adaptive").build(do_sample=False)


def test_bench_compares_the_device_step_with_the_engine(tiny_model_dir, tmp_path, single_thread) -> None:
    """`bench --methods none,token_recycling,token_recycling:step=device`: the device row is identical to
    plain greedy and accepts what the engine's row accepts, prompt by prompt."""
    from warpdecode.cli import main

    main(["bench", "--model", str(tiny_model_dir), "--methods", "none,token_recycling,token_recycling:step=device",
          "--prompts", "gsm8k", "--limit", "3", "--max-new-tokens", "12", "--threads", "1", "--peers", "none",
          "--warmup-tokens", "0", "--out", str(tmp_path / "run")])
    data = json.loads((tmp_path / "run" / "results.json").read_text())
    rows: dict[str, dict[str, dict]] = {}
    for m in data["measurements"]:
        rows.setdefault(m["row"], {})[m["prompt_id"]] = m
    engine, device = rows["token_recycling"], rows["token_recycling:step=device"]
    assert set(engine) == set(device) and len(engine) >= 1
    for prompt, m in device.items():
        assert m["token_ids"] == rows["none"][prompt]["token_ids"] == engine[prompt]["token_ids"]
        assert (m["accepted"], m["target_forwards"]) == (engine[prompt]["accepted"], engine[prompt]["target_forwards"])
