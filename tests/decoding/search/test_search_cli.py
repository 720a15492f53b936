"""`warpdecode generate` with Hugging Face's search flags and search methods."""

import json

import pytest

from warpdecode.cli import main
from warpdecode.decoding.generate import generate
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")


def test_beam_flags_give_the_python_api_sequences(tiny_model_dir, capsys):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "print(", "--chat", "false", "--max-new-tokens", "6"]
    main([*base, "--num-beams", "3", "--num-return-sequences", "2", "--length-penalty", "0.5",
          "--early-stopping", "never", "--no-repeat-ngram-size", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    model, tokenizer = load_pretrained(tiny_model_dir)
    ref = generate(model, tokenizer, "print(", chat=False, max_new_tokens=6, num_beams=3, num_return_sequences=2,
                   length_penalty=0.5, early_stopping="never", no_repeat_ngram_size=2)
    assert [s["token_ids"] for s in out["sequences"]] == [s.token_ids for s in ref.sequences]
    assert out["token_ids"] == ref.token_ids and out["stats"]["search_tokens"] == ref.stats.search_tokens

    main([*base, "--num-beams", "4", "--num-beam-groups", "2", "--diversity-penalty", "0.5", "--num-return-sequences", "2"])
    printed = capsys.readouterr().out
    assert printed.count("--- sequence") == 2 and "score" in printed


def test_search_methods_run_from_method(tiny_model_dir, capsys):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "print(", "--chat", "false", "--max-new-tokens", "5",
            "--temperature", "1", "--seed", "3", "--json"]
    main([*base, "--method", "best_of_n:n=3:scorer=length"])
    best = json.loads(capsys.readouterr().out)
    assert len(best["sequences"]) == 3 and best["text"] == best["sequences"][0]["text"]
    assert [s["score"] for s in best["sequences"]] == sorted((s["score"] for s in best["sequences"]), reverse=True)
    main([*base, "--method", "first_finish:n=3"])
    first = json.loads(capsys.readouterr().out)
    assert len(first["sequences"]) == 1 and first["stats"]["search_tokens"] <= 3 * 5
