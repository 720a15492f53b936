"""Instruction prompts built from text already on disk, for the task types of general chat benchmarks.

A drafter learns what its target says in the situations it was trained on. GSM8K questions and
"write a function" prompts teach it math and code only; a chat benchmark (Spec-Bench: MT-Bench's
writing, roleplay, reasoning, STEM, humanities and extraction, plus translation, summarization,
QA and RAG) asks for much more. These sources cover those task types without touching any
evaluation set:

    summarize     "Summarize: <passage>"                       passages: stdlib docstring prose
    context_qa    "<passage>\\n\\nBased on the text above, ..."  (train split of the stdlib corpus)
    extract       "Extract ... from the following text: ..."
    translate_de  "Translate German to English: <sentence>"    the German message catalogs of the
                                                                installed programs (/usr/share/locale)
    writing       blog posts, stories, emails, speeches about everyday topics
    roleplay      "Pretend to be <persona>. <question>"
    explain       STEM and humanities concepts ("What is ...", "Explain ... to a beginner")

Every source is deterministic for a given Python install and machine; `source_stamp` says what it
depends on, so caches keyed by it notice a change.
"""

from __future__ import annotations

import gettext
import hashlib
from collections.abc import Callable
from functools import cache
from pathlib import Path

from warpdecode.data.stdlib import docstrings, parse, split_sources, stdlib_stamp
from warpdecode.datamodules.prompt import DistillPrompt

PASSAGE_MIN_WORDS = 40
PASSAGE_MAX_WORDS = 200
"""Passages are one or more consecutive docstring paragraphs of PASSAGE_MIN_WORDS..MAX words."""
PROSE_LETTER_FRACTION = 0.85
"""A paragraph is prose when letters and spaces make up at least this fraction of it (not a table or code)."""
SENTENCE_MIN_WORDS = 6
GERMAN_CATALOGS = Path("/usr/share/locale/de/LC_MESSAGES")

WRITING_TEMPLATES = (
    "Compose an engaging blog post about {topic}.",
    "Write a short story that involves {topic}.",
    "Write a persuasive email to a friend about {topic}.",
    "Draft a short speech for a community event about {topic}.",
    "Write a product description for something related to {topic}.",
    "Write a poem about {topic}.",
    "Give five practical tips about {topic}, with a sentence explaining each.",
    "Write a diary entry about a day spent on {topic}.",
)
TOPICS = (
    "a weekend trip to the mountains", "learning to cook at home", "starting a vegetable garden",
    "the first day at a new job", "saving money on groceries", "adopting a rescue dog",
    "a visit to a science museum", "training for a marathon", "moving to a new city",
    "a family reunion", "learning a second language", "a rainy afternoon in a small town",
    "building a treehouse", "volunteering at an animal shelter", "a road trip along the coast",
    "organising a book club", "working from home", "a winter festival", "repairing an old bicycle",
    "a school science fair", "planning a surprise party", "camping under the stars",
    "a street food market", "learning to play the guitar", "cleaning up a local park",
    "a power cut during a storm", "a visit to grandparents", "the history of a local bridge",
    "a new public library", "reducing plastic waste", "a chess tournament", "a hot air balloon ride",
    "the opening of a small bakery", "a lost wallet returned by a stranger", "a long train journey",
    "a neighbourhood football match", "keeping a houseplant alive", "a museum of old computers",
    "a summer job at a farm", "a trip to a night market",
)
ROLEPLAY_PERSONAS = (
    "a ship captain in the 18th century", "a friendly museum guide", "a famous chef",
    "a detective solving a mystery", "an astronaut on the space station", "a medieval knight",
    "a personal fitness coach", "a park ranger", "a kind primary school teacher",
    "a travel agent", "a startup founder pitching to investors", "a librarian",
    "a mountain guide", "a sports commentator", "a wise old wizard", "a customer support agent",
)
ROLEPLAY_QUESTIONS = (
    "How do you start your day?", "What is the hardest part of your work?",
    "What advice would you give to someone new to your field?", "Tell me about your proudest moment.",
    "What would you change about your job if you could?", "Describe a mistake you learned from.",
    "How do you deal with stress?", "What do you think the future holds for people like you?",
    "Why should I trust your recommendation?", "What is a common misunderstanding about what you do?",
    "Introduce yourself in a few sentences.", "What tools could you not work without?",
)
EXPLAIN_TEMPLATES = (
    "What is {concept}?",
    "Explain {concept} to a beginner.",
    "Describe {concept} and give an example.",
    "Why does {concept} matter? Answer in a short paragraph.",
    "What are the main ideas behind {concept}?",
    "Compare {concept} with a related idea and explain the difference.",
)
CONCEPTS = (
    "photosynthesis", "inflation", "the water cycle", "plate tectonics", "supply and demand",
    "natural selection", "the theory of relativity", "compound interest", "the French Revolution",
    "democracy", "the Renaissance", "machine learning", "the immune system", "climate change",
    "the Industrial Revolution", "gravity", "DNA replication", "opportunity cost", "the Roman Empire",
    "impressionist painting", "a black hole", "electric circuits", "the scientific method",
    "the printing press", "vaccination", "renewable energy", "the stock market", "entropy",
    "the Cold War", "plate glass manufacturing", "the Silk Road", "encryption", "a recession",
    "the periodic table", "the human heart", "existentialism", "the greenhouse effect",
    "probability", "the Great Depression", "sound waves", "ocean tides", "the Pythagorean theorem",
    "cognitive dissonance", "the Magna Carta", "volcanoes", "antibiotics", "globalisation",
    "the speed of light", "utilitarianism", "the nervous system",
)
CONTEXT_QUESTIONS = (
    "what is the main purpose of what is described?",
    "what are the key points? List them.",
    "what should a user be careful about?",
    "explain it in simpler words.",
    "what question does this text answer?",
)
EXTRACT_TEMPLATES = (
    ("Extract every name written in code style (functions, arguments, modules) from the following "
     "text and list them one per line:\n\n{passage}"),
    "List the five most important keywords of the following text as comma-separated values:\n\n{passage}",
    ("Read the following text and return a JSON object with the keys \"subject\" and \"summary\":\n\n"
     "{passage}"),
)


def _pick(templates: tuple[str, ...], key: str) -> str:
    """A template chosen by a stable hash of `key` (not Python's salted `hash`)."""
    return templates[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(templates)]


def _is_prose(paragraph: str) -> bool:
    return sum(c.isalpha() or c.isspace() for c in paragraph) >= PROSE_LETTER_FRACTION * len(paragraph)


def docstring_passages(source: str) -> list[str]:
    """Prose passages of one Python file's docstrings: runs of consecutive prose paragraphs of one
    docstring, joined until PASSAGE_MIN_WORDS is reached and never past PASSAGE_MAX_WORDS."""
    passages = []
    for docstring in docstrings(parse(source)):
        words: list[str] = []
        for paragraph in docstring.split("\n\n"):
            tokens = paragraph.split()
            if not tokens or not _is_prose(paragraph) or len(words) + len(tokens) > PASSAGE_MAX_WORDS:
                if len(words) >= PASSAGE_MIN_WORDS:
                    passages.append(" ".join(words))
                words = []
                if not tokens or not _is_prose(paragraph) or len(tokens) > PASSAGE_MAX_WORDS:
                    continue
            words += tokens
        if len(words) >= PASSAGE_MIN_WORDS:
            passages.append(" ".join(words))
    return passages


@cache
def stdlib_passages() -> tuple[tuple[str, str], ...]:
    """(id, passage) of the docstring prose of the stdlib corpus's train split, in file order."""
    return tuple((f"{key}#{i}", passage) for key, source in split_sources("train")
                 for i, passage in enumerate(docstring_passages(source)))


def catalog_sentences(path: Path) -> list[str]:
    """The translated messages of one gettext `.mo` catalog that read as sentences: at least
    SENTENCE_MIN_WORDS words, one line, no printf/format placeholders. A catalog that does not parse
    gives none."""
    try:
        with path.open("rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    sentences = []
    for message_id, text in catalog.items():
        if not isinstance(message_id, str) or not message_id or not isinstance(text, str):
            continue
        text = " ".join(text.split())
        if (len(text.split()) >= SENTENCE_MIN_WORDS and "\n" not in message_id
                and not any(mark in text for mark in ("%", "{", "<", "`", "\\"))):
            sentences.append(text)
    return sentences


@cache
def german_sentences() -> tuple[str, ...]:
    """Distinct German sentences of every catalog in GERMAN_CATALOGS, in file then catalog order."""
    paths = sorted(GERMAN_CATALOGS.glob("*.mo")) if GERMAN_CATALOGS.is_dir() else []
    return tuple(dict.fromkeys(s for path in paths for s in catalog_sentences(path)))


def _user(source: str, key: str, text: str) -> DistillPrompt:
    return DistillPrompt(f"{source}/{key}", (("user", text),))


def summarize_prompts() -> list[DistillPrompt]:
    return [_user("summarize", key, f"Summarize: {passage}") for key, passage in stdlib_passages()]


def context_qa_prompts() -> list[DistillPrompt]:
    return [_user("context_qa", key, f"{passage}\n\nBased on the text above, {_pick(CONTEXT_QUESTIONS, key)}")
            for key, passage in stdlib_passages()]


def extract_prompts() -> list[DistillPrompt]:
    return [_user("extract", key, _pick(EXTRACT_TEMPLATES, key).format(passage=passage))
            for key, passage in stdlib_passages()]


def translate_de_prompts() -> list[DistillPrompt]:
    return [_user("translate_de", str(i), f"Translate German to English: {sentence}")
            for i, sentence in enumerate(german_sentences())]


def writing_prompts() -> list[DistillPrompt]:
    return [_user("writing", f"{t}/{i}", template.format(topic=topic))
            for t, template in enumerate(WRITING_TEMPLATES) for i, topic in enumerate(TOPICS)]


def roleplay_prompts() -> list[DistillPrompt]:
    return [_user("roleplay", f"{p}/{q}", f"Pretend to be {persona} in this conversation. {question}")
            for p, persona in enumerate(ROLEPLAY_PERSONAS) for q, question in enumerate(ROLEPLAY_QUESTIONS)]


def explain_prompts() -> list[DistillPrompt]:
    return [_user("explain", f"{t}/{c}", template.format(concept=concept))
            for t, template in enumerate(EXPLAIN_TEMPLATES) for c, concept in enumerate(CONCEPTS)]


INSTRUCTION_SOURCES: dict[str, Callable[[], list[DistillPrompt]]] = {
    "summarize": summarize_prompts,
    "context_qa": context_qa_prompts,
    "extract": extract_prompts,
    "translate_de": translate_de_prompts,
    "writing": writing_prompts,
    "roleplay": roleplay_prompts,
    "explain": explain_prompts,
}


def source_stamp(source: str) -> list[object]:
    """What an instruction source's prompts depend on, without building them."""
    if source == "translate_de":
        paths = sorted(GERMAN_CATALOGS.glob("*.mo")) if GERMAN_CATALOGS.is_dir() else []
        return [source, [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in paths]]
    return [source, *stdlib_stamp()]
