"""Greedy continuation of token ids by llama.cpp (llama-cpp-python), to compare with warpdecode's.

Run with the interpreter of an environment that has llama-cpp-python (never a warpdecode dependency):

    /tmp/llamacpp-venv/bin/python scripts/llama_cpp_greedy.py draft.gguf '[272, 285, 286]' 16

Prints the JSON list of the `n` token ids llama.cpp picks greedily after the prompt ids (no sampling
filters, no repetition penalty), as `warpdecode convert-drafter --format gguf` is checked against.
With `--target TARGET.gguf` it first checks the draft against the target as llama.cpp's speculative
decoding does before it accepts a draft model (`common_speculative_are_compatible`: the same vocabulary
size within 128, the same BOS and EOS ids, the same text for every token id from 5 on) and exits 1 on
a mismatch.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from llama_cpp import Llama

    args = sys.argv[1:]
    target = None
    if "--target" in args:
        i = args.index("--target")
        target, args = args[i + 1], args[:i] + args[i + 2:]
    path, prompt, n = args[0], json.loads(args[1]), int(args[2])
    llm = Llama(model_path=path, n_ctx=max(64, 2 * (len(prompt) + n)), n_threads=1, verbose=False)
    if target is not None:
        reference = Llama(model_path=target, n_ctx=64, n_threads=1, verbose=False, vocab_only=True)
        problems = [what for what, ours, theirs in (("vocabulary size", llm.n_vocab(), reference.n_vocab()),
                                                    ("BOS", llm.token_bos(), reference.token_bos()),
                                                    ("EOS", llm.token_eos(), reference.token_eos())) if ours != theirs]
        problems += [f"token {i}" for i in range(5, min(llm.n_vocab(), reference.n_vocab()))
                     if llm.detokenize([i], special=True) != reference.detokenize([i], special=True)][:3]
        if problems:
            sys.exit(f"the draft's vocabulary differs from the target's: {', '.join(problems)}")
    out: list[int] = []
    for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if len(out) == n:
            break
    print(json.dumps(out))


if __name__ == "__main__":
    main()
