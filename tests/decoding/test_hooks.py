"""The caller's logits hooks and stop strings: against Hugging Face's processors and `generate()`,
per tree row, and streamed without ever sending a stop string."""

import pytest
import torch
from tiny_models import greedy_target, id_tokenizer

from warpdecode.decoding.generate import generate
from warpdecode.decoding.hooks import BadWords, CallerProcessors, LogitsHooks, SequenceBias
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.stop_strings import StopStrings
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")

BIASES = {(7,): 2.5, (3, 9): -4.0, (1, 3, 9): 1.5, (3, 7): 0.75, (2, 3, 4, 5, 6, 11): 9.0}
HISTORY = TokenHistory(torch.tensor([4, 1, 3]), prompt_len=1, extra=((), (9,), (9, 3), (1, 3)))


def rows_through(hf_processor, logits):
    """Hugging Face's processor on each row of `HISTORY` with that row's own input_ids."""
    return torch.cat([hf_processor(HISTORY.context(r)[None], logits[r : r + 1].clone()) for r in range(len(HISTORY.extra))])


def test_history_context_and_tail():
    assert HISTORY.context(2).tolist() == [4, 1, 3, 9, 3]
    assert HISTORY.tail(2, 3) == [3, 9, 3] and HISTORY.tail(1, 9) == [4, 1, 3, 9] and HISTORY.tail(0, 0) == []


def test_sequence_bias_matches_transformers_row_by_row():
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    ref = rows_through(transformers.SequenceBiasLogitsProcessor([[list(k), v] for k, v in BIASES.items()]), logits)
    ours = SequenceBias(BIASES)(logits, HISTORY)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert ours[0, 9] == logits[0, 9] - 4.0 + 1.5  # row 0 ends [.., 1, 3]: both sequences ending in 9 add up


def test_bad_words_match_transformers_row_by_row_and_keep_a_stop_token():
    transformers = pytest.importorskip("transformers")
    bad = [[3, 9], [5], [1, 3, 7], [0]]
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    ref = rows_through(transformers.NoBadWordsLogitsProcessor(bad, eos_token_id=0), logits)
    ours = BadWords(bad, stop_ids=(0,))(logits, HISTORY)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert torch.isinf(ours[:, 5]).all() and not torch.isinf(ours[:, 0]).any()


def test_caller_processors_see_each_rows_own_context():
    seen = []

    def record(input_ids, scores):
        seen.append(input_ids[0].tolist())
        scores[0, int(input_ids[0, -1])] = -100.0  # in place: the caller's tensor must not change
        return scores

    logits = torch.zeros(4, 16)
    out = CallerProcessors((record,))(logits, HISTORY)
    assert seen == [HISTORY.context(r).tolist() for r in range(4)]
    assert out[:, [3, 9, 3, 3]].diagonal().tolist() == [-100.0] * 4 and logits.abs().sum() == 0


@pytest.mark.parametrize("bad", [
    {"logits_processor": [1]}, {"sequence_bias": {(): 1.0}}, {"sequence_bias": {(1,): "x"}}, {"sequence_bias": {}},
    {"bad_words_ids": [[-1]]}, {"bad_words_ids": []}, {"bad_words_ids": [3]},
])
def test_bad_hook_arguments_are_config_errors(bad):
    with pytest.raises(ConfigError):
        LogitsHooks(**bad)


def test_a_token_beyond_the_vocabulary_is_a_config_error():
    with pytest.raises(ConfigError, match="vocabulary has 16"):
        SequenceBias({(3, 40): 1.0})(torch.zeros(1, 16), HISTORY)


def test_stop_check_keeps_the_tokens_through_the_one_that_completes_the_stop():
    check = StopStrings(id_tokenizer(16), ("t3 t4",))
    assert check.check([1, 2, 3]) is None
    assert check.check([4, 5, 3, 4]) == 1 and check.tokens == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


def test_stop_string_cuts_tokens_text_and_stream(target):
    tokenizer = id_tokenizer(64)
    plain = generate(target, tokenizer, PROMPT, max_new_tokens=24, stop_at_eos=False)
    stop = " ".join(plain.text.split()[6:8])  # its first occurrence is earlier: "t42 t8" at tokens 2-3
    chunks: list[str] = []
    out = generate(target, tokenizer, PROMPT, max_new_tokens=24, stop_at_eos=False, stop=[stop, "zzz"],
                   streamer=chunks.append)
    first = plain.text.index(stop)
    assert out.finish_reason == "stop" and out.text == plain.text[:first] and "".join(chunks) == out.text
    assert out.token_ids == plain.token_ids[:4]
    assert generate(target, tokenizer, PROMPT, max_new_tokens=24, stop_at_eos=False,
                    stop_strings=stop).token_ids == out.token_ids


def test_eos_token_id_replaces_the_stop_tokens(target):
    plain = generate(target, None, PROMPT, max_new_tokens=24, stop_at_eos=False).token_ids
    out = generate(target, None, PROMPT, max_new_tokens=24, eos_token_id=[63, plain[4]])
    assert out.token_ids == plain[:5] and out.finish_reason == "eos"
    assert generate(target, None, PROMPT, max_new_tokens=24, eos_token_id=plain[2]).token_ids == plain[:3]


def test_stop_strings_need_a_tokenizer_and_not_the_device_step(target):
    with pytest.raises(ConfigError, match="tokenizer"):
        generate(target, None, PROMPT, max_new_tokens=4, stop="x")
    with pytest.raises(CapabilityError, match="stop strings"):
        generate(target, id_tokenizer(64), PROMPT, max_new_tokens=4, stop="x", method="prompt_lookup", device_step=True)


@pytest.fixture(scope="module")
def tiny_pair(tiny_model_dir):
    """The tiny BPE model as warpdecode and as Hugging Face transformers load it, and HF's tokenizer."""
    transformers = pytest.importorskip("transformers")
    model, tokenizer = load_pretrained(tiny_model_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, tokenizer, hf, transformers.PreTrainedTokenizerFast(tokenizer_file=str(tiny_model_dir / "tokenizer.json"))


def hf_generate(hf, ids, n, **kwargs):
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(ids):].tolist()


def test_bad_words_and_sequence_bias_equal_transformers_generate(tiny_pair):
    model, tokenizer, hf, _ = tiny_pair
    ids = tokenizer.encode("for i in")
    plain = generate(model, tokenizer, ids, max_new_tokens=16, stop_at_eos=False).token_ids
    bad = [[plain[1]], [plain[3], plain[4]], [plain[0], 5, 6]]
    bias = {(plain[2],): -3.0, (plain[5], plain[6]): -20.0, (plain[0], 17): 8.0}
    for kwargs in ({"bad_words_ids": bad}, {"sequence_bias": bias}, {"bad_words_ids": bad, "sequence_bias": bias}):
        ours = generate(model, tokenizer, ids, max_new_tokens=16, stop_at_eos=False, **kwargs).token_ids
        assert ours == hf_generate(hf, ids, 16, eos_token_id=None, **kwargs) != plain, kwargs
    assert generate(model, tokenizer, ids, max_new_tokens=16, stop_at_eos=False, method="prompt_lookup",
                    bad_words_ids=bad).token_ids == hf_generate(hf, ids, 16, eos_token_id=None, bad_words_ids=bad)


@pytest.mark.parametrize("prompt, stop", [("print(", "$b"), ("print(", "iiii"), ("hello", "bob"), ("hello", "\nddd")])
def test_stop_strings_equal_transformers_generate(tiny_pair, prompt, stop):
    model, tokenizer, hf, hf_tokenizer = tiny_pair
    ids = tokenizer.encode(prompt)
    plain = generate(model, tokenizer, ids, max_new_tokens=24, stop_at_eos=False)
    ours = generate(model, tokenizer, ids, max_new_tokens=24, stop_at_eos=False, stop=stop)
    ref = hf_generate(hf, ids, 24, eos_token_id=None, stop_strings=stop, tokenizer=hf_tokenizer)
    assert ours.token_ids == ref and len(ref) < 24 and ours.finish_reason == "stop"
    assert ours.text == plain.text[: plain.text.index(stop)]


@pytest.mark.slow
def test_hooks_equal_transformers_generate_on_the_default_model(smollm2, smollm2_transformers):
    transformers = pytest.importorskip("transformers")
    tokenizer = smollm2.tokenizer
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}]),
                           add_special_tokens=False)
    plain = generate(smollm2.model, tokenizer, ids, max_new_tokens=20)
    words = [tokenizer.encode(" " + w, add_special_tokens=False) for w in ("red", "blue", "green", "Red")]
    bias = {tuple(plain.token_ids[:2]): -5.0, (plain.token_ids[3],): -2.0}
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2.directory))
    stop = plain.text[12:16]
    for ours, theirs in (
        ({"bad_words_ids": words}, {"bad_words_ids": words}),
        ({"sequence_bias": bias}, {"sequence_bias": bias}),
        ({"stop": stop, "method": "prompt_lookup"}, {"stop_strings": stop, "tokenizer": hf_tokenizer}),
    ):
        out = generate(smollm2.model, tokenizer, ids, max_new_tokens=20, **ours)
        assert out.token_ids == hf_generate(smollm2_transformers, ids, 20, **theirs) != plain.token_ids, ours
    assert out.text == plain.text[: plain.text.index(stop)] and out.finish_reason == "stop"
