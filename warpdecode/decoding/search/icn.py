"""In-context navigation (ICN; "Correlation and Navigation in the Vocabulary Key Representation Space of
Language Models"): n answers in turn, each asked for with the answers explored so far in the context and
an instruction to give something else, which pushes the query away from the keys already explored.

It returns several candidates, so it is a search strategy. Each answer is decoded with the request's
sampler (greedy unless sampling: the context alone makes the answers differ) from a context that
continues the conversation: the prompt, the previous answer, and a user turn with the instruction,
rendered by the tokenizer's chat template (the text the template adds after an assistant answer and
before the next assistant answer, found by rendering a conversation with and without that turn); a
tokenizer without a chat template continues the text with the instruction on a line of its own.
Candidates come in the order they were explored (the first is plain decoding's answer), with the
target's log-probability of each under its own context.
"""

from __future__ import annotations

import time

from warpdecode.decoding.outputs import Candidate, DecodeStats
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS
from warpdecode.decoding.search.sample import sample_rows
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

INSTRUCTION = "Give an answer different from the ones above."


def follow_up(tokenizer: Tokenizer, instruction: str) -> tuple[str, str]:
    """The text a chat template puts after an assistant answer's content, and the text of a user turn
    saying `instruction` followed by the next assistant header: (end of answer, next turn)."""
    if tokenizer.chat_template is None:
        return "", f"\n\n{instruction}\n"
    asked = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}])
    answered = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
                                             add_generation_prompt=False)
    again = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                                           {"role": "user", "content": instruction}])
    if not (answered.startswith(asked + "A") and again.startswith(answered)):
        raise ConfigError("icn cannot continue this chat template's conversation (a later turn changes earlier text)")
    return answered[len(asked) + 1 :], again[len(answered) :]


@register("search", "icn")
class InContextNavigation(SearchStrategy):
    composes_with_speculation = False  # each answer is one plain decode: a drafter could run it, not built

    def __init__(self, n: int = 3, instruction: str = INSTRUCTION) -> None:
        if not 1 <= n <= MAX_ROWS:
            raise ConfigError(f"icn needs n in [1, {MAX_ROWS}], got {n}")
        if not instruction.strip():
            raise ConfigError("icn needs a non-empty instruction")
        self.n = self.num_return_sequences = n
        self.instruction = instruction

    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        if tokenizer is None:
            raise ConfigError("icn writes the explored answers back into the prompt: it needs a tokenizer")
        start = time.perf_counter()
        end, turn = follow_up(tokenizer, self.instruction)
        stats = DecodeStats(prompt_tokens=len(prompt))
        candidates: list[Candidate] = []
        context = list(prompt)
        for i in range(self.n):
            budget = min(max_new_tokens, model.config.max_seq_len - len(context))
            if budget < 1:
                raise ConfigError(f"icn: answer {i + 1} of {self.n} does not fit the context of "
                                  f"{model.config.max_seq_len} tokens; ask for fewer answers or fewer tokens")
            result = sample_rows(model, tokenizer, context, sampler, 1, max_new_tokens=budget, stop_ids=stop_ids)
            answer = result.candidates[0]
            candidates.append(answer)
            stats.target_forwards += result.stats.target_forwards
            stats.search_tokens += result.stats.search_tokens
            if not stats.time_to_first_token:
                stats.time_to_first_token = result.stats.time_to_first_token
            content = tokenizer.decode(t for t in answer.token_ids if t not in stop_ids)
            context += tokenizer.encode(content + end + turn, add_special_tokens=False)
        stats.new_tokens = len(candidates[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(candidates, stats)
