"""Elementary discourse units (EDUs) of a source text, their salience, and diverse extractive content plans.

Adams et al. 2023 ("Generating EDU Extracts for Plan-Guided Summary Re-Ranking") split the source into
EDUs with a trained discourse segmenter and let a fine-tuned BART choose sets of them (content plans).
Neither exists offline here, so both are rules:

* `segment`: sentences (a period, `!` or `?` followed by a capital, a digit or a quote, with a list of
  abbreviations that do not end one; and line breaks), then clauses inside a sentence at `;`, `:` and
  spaced dashes, and before a discourse connective (`, which` / `, but` / `, while` ..., or `because` /
  `although` / `unless` ... with or without a comma). Pieces under `min_words` words join the piece before.
  Limits: no syntax, so a clause joined by a bare "and", a relative clause without a comma or a
  reported-speech clause stays inside its EDU; an abbreviation missing from the list, or a sentence that
  starts lower-case, is a wrong or missed sentence boundary; quotes are not balanced across EDUs.
* `salience`: the share of an EDU's content words (3+ letters, not a stop word) that other EDUs repeat,
  plus a lead bonus `position_weight / (1 + sentence index)` (news puts its gist first).
* `content_plans`: n distinct sets of `size` EDUs, built greedily one after another; each pick maximises
  salience minus `diversity` times (how many earlier plans used the EDU + its largest content-word
  Jaccard overlap with the EDUs already in this plan), among the EDUs that still lead to a new set. A
  source of m EDUs has C(m, size) plans: asked for more, it returns them all.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

ABBREVIATIONS = frozenset(("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "inc", "ltd", "co",
                           "corp", "gen", "gov", "sen", "rep", "rev", "lt", "col", "sgt", "capt", "jan", "feb",
                           "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "no", "fig",
                           "e.g", "i.e", "u.s", "u.k", "a.m", "p.m"))
"""Lower-cased words (without their final period) after which a period does not end a sentence."""
CONNECTIVES = ("which", "who", "whom", "whose", "where", "while", "whereas", "but", "yet", "although", "though",
               "because", "since", "so", "when", "after", "before", "unless", "until", "if", "as", "including",
               "according", "despite", "however")
"""Words that open a new EDU after a comma."""
SUBORDINATORS = ("because", "although", "though", "whereas", "unless", "so that")
"""Words that open a new EDU even without a comma."""
STOP_WORDS = frozenset(("the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was",
                        "one", "our", "out", "has", "have", "him", "his", "how", "its", "may", "new", "now", "old",
                        "see", "two", "way", "who", "did", "get", "let", "say", "she", "too", "use", "that", "with",
                        "they", "this", "from", "will", "would", "there", "their", "what", "were", "been", "said",
                        "which", "when", "your", "than", "then", "them", "these", "into", "also", "could", "more",
                        "some", "such", "only", "other", "about", "after", "over", "most", "just"))

_SENTENCE_END = re.compile(r"[.!?]+[\"')\]’”]*\s+(?=[\"'(\[‘“]?[A-Z0-9])")
_CLAUSE = re.compile(r"(?<=;)\s+|(?<=\w:)\s+|\s+[–—-]\s+|,\s+(?=(?:" + "|".join(CONNECTIVES) + r")\b)"
                     r"|\s+(?=(?:" + "|".join(SUBORDINATORS) + r")\b)", re.IGNORECASE)


@dataclass(frozen=True)
class Edu:
    text: str
    sentence: int
    """Index of the sentence it belongs to (0 = first)."""


def words(text: str) -> list[str]:
    """Lower-cased word tokens: "Lake Quen's." → ["lake", "quen", "s"]."""
    return re.findall(r"\w+", text.lower())


def content_words(text: str) -> set[str]:
    return {w for w in words(text) if len(w) >= 3 and w not in STOP_WORDS}


def sentences(text: str) -> list[str]:
    """The text's sentences, whitespace-normalised, in order (see the module docstring for the rule)."""
    out: list[str] = []
    for line in text.splitlines():
        line = " ".join(line.split())
        begin = 0
        for match in _SENTENCE_END.finditer(line):
            last = line[begin : match.start()].split()
            if last and last[-1].lower().rstrip(".") in ABBREVIATIONS and line[match.start()] == ".":
                continue
            if last and len(last[-1]) == 1 and last[-1].isupper():  # an initial: "J. K. Rowling"
                continue
            out.append(line[begin : match.end()].strip())
            begin = match.end()
        if line[begin:].strip():
            out.append(line[begin:].strip())
    return out


def segment(text: str, *, min_words: int = 3) -> list[Edu]:
    """The text's EDUs in order: sentences split into clauses, pieces under `min_words` words joined to
    the piece before (or after, for a sentence's first piece)."""
    edus: list[Edu] = []
    for index, sentence in enumerate(sentences(text)):
        pieces: list[str] = []
        for piece in (p.strip(" ,") for p in _CLAUSE.split(sentence)):
            if not piece:
                continue
            if pieces and (len(words(piece)) < min_words or len(words(pieces[-1])) < min_words):
                pieces[-1] = f"{pieces[-1]} {piece}"
            else:
                pieces.append(piece)
        edus += [Edu(p, index) for p in pieces]
    return edus


def salience(edus: Sequence[Edu], *, position_weight: float = 0.5) -> list[float]:
    """One score per EDU, higher is more central (see the module docstring)."""
    bags = [content_words(e.text) for e in edus]
    frequency = Counter(w for bag in bags for w in bag)
    return [sum(frequency[w] > 1 for w in bag) / (len(bag) + 1) + position_weight / (1 + e.sentence)
            for e, bag in zip(edus, bags, strict=True)]


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def content_plans(edus: Sequence[Edu], scores: Sequence[float], *, n: int, size: int,
                  diversity: float = 0.5) -> list[tuple[int, ...]]:
    """Up to `n` distinct plans, each `min(size, len(edus))` EDU indices in document order, the first
    the most salient (see the module docstring)."""
    size = min(size, len(edus))
    bags = [content_words(e.text) for e in edus]
    uses = [0] * len(edus)
    plans: list[tuple[int, ...]] = []

    def completable(partial: list[int]) -> bool:  # some set of `size` EDUs holding `partial` is no plan yet
        taken = sum(set(partial) <= set(p) for p in plans)
        return taken < math.comb(len(edus) - len(partial), size - len(partial))

    while len(plans) < n and size and completable([]):
        plan: list[int] = []
        while len(plan) < size:
            options = [i for i in range(len(edus)) if i not in plan and completable(plan + [i])]
            gain = {i: scores[i] - diversity * (uses[i] + max((_jaccard(bags[i], bags[j]) for j in plan), default=0.0))
                    for i in options}
            plan.append(max(options, key=lambda i: gain[i]))  # ties: the earlier EDU
        for i in plan:
            uses[i] += 1
        plans.append(tuple(sorted(plan)))
    return plans
