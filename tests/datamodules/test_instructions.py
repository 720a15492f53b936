"""Instruction prompt sources over text on disk: passages, catalog sentences, templates, stamps."""

from __future__ import annotations

import struct

import pytest

from warpdecode.bench.prompts import held_out_stdlib_files
from warpdecode.data.corpus import split_of
from warpdecode.datamodules import instructions, prompt_sources
from warpdecode.datamodules.instructions import catalog_sentences, docstring_passages


def mo_bytes(messages: dict[str, str]) -> bytes:
    """A GNU gettext `.mo` catalog (UTF-8) holding `messages`, as `msgfmt` writes it."""
    entries = sorted({"": "Content-Type: text/plain; charset=UTF-8\n", **messages}.items())
    ids = [k.encode() for k, _ in entries]
    texts = [v.encode() for _, v in entries]
    n, header = len(entries), 7 * 4
    ids_table, texts_table = header, header + 8 * n
    data_start = header + 16 * n
    blob, id_pairs, text_pairs = b"", [], []
    for strings, pairs in ((ids, id_pairs), (texts, text_pairs)):
        for s in strings:
            pairs.append((len(s), data_start + len(blob)))
            blob += s + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, n, ids_table, texts_table, 0, 0)
    out += b"".join(struct.pack("<2I", *p) for p in id_pairs + text_pairs)
    return out + blob


def words(n: int, word: str = "word") -> str:
    return " ".join([word] * n)


def test_passages_join_consecutive_prose_paragraphs_within_bounds():
    source = f'''
"""{words(30, "alpha")}

{words(15, "beta")}

>>> x = [1, 2, 3]; y = {{k: v for k, v in x}}; print(x[0] + y[1] * 2 - 3 / 4)

{words(10, "gamma")}
"""

def f():
    """{words(250, "delta")}"""

class C:
    """{words(150, "eps")}

    {words(100, "zeta")}
    """
'''
    passages = docstring_passages(source)
    # 30 + 15 words join into one passage; the code line ends it; 10 words alone are too few;
    # 250 words are too many; 150 + 100 would pass the maximum, so each stands alone.
    assert passages == [f"{words(30, 'alpha')} {words(15, 'beta')}", words(150, "eps"), words(100, "zeta")]
    assert docstring_passages("def broken(:\n") == []


def test_catalog_sentences_keep_one_line_sentences_without_placeholders(tmp_path):
    path = tmp_path / "tool.mo"
    path.write_bytes(mo_bytes({
        "The file could not be opened by the program": "Die Datei konnte vom Programm nicht geöffnet werden",
        "Could not open %s for writing now": "Konnte %s jetzt nicht zum Schreiben öffnen, leider",
        "Too short": "Zu kurz",
        "Line one\nline two of a message here": "Zeile eins und Zeile zwei einer Nachricht hier",
    }))
    assert catalog_sentences(path) == ["Die Datei konnte vom Programm nicht geöffnet werden"]
    (tmp_path / "broken.mo").write_bytes(b"not a catalog")
    assert catalog_sentences(tmp_path / "broken.mo") == []


def test_translation_prompts_and_stamp_follow_the_catalog_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(instructions, "GERMAN_CATALOGS", tmp_path)
    (tmp_path / "a.mo").write_bytes(mo_bytes({"x y z w v u": "Das ist ein ganz normaler deutscher Satz"}))
    instructions.german_sentences.cache_clear()
    try:
        stamp = instructions.source_stamp("translate_de")
        prompts = instructions.translate_de_prompts()
        assert [p.messages for p in prompts] == [
            (("user", "Translate German to English: Das ist ein ganz normaler deutscher Satz"),)]
        (tmp_path / "b.mo").write_bytes(mo_bytes({"a b c d e f": "Noch ein zweiter deutscher Satz für den Test"}))
        assert instructions.source_stamp("translate_de") != stamp
    finally:
        instructions.german_sentences.cache_clear()


def test_template_sources_are_distinct_deterministic_and_registered():
    for name in ("writing", "roleplay", "explain"):
        prompts = prompt_sources.SOURCES[name]()
        texts = [p.messages[0][1] for p in prompts]
        assert len(set(texts)) == len(texts) > 100, name
        assert len({p.id for p in prompts}) == len(prompts)
        assert prompts == prompt_sources.SOURCES[name]()
    assert set(instructions.INSTRUCTION_SOURCES) <= set(prompt_sources.SOURCES)


@pytest.mark.slow
def test_passage_sources_use_the_train_split_only(monkeypatch):
    passages = instructions.stdlib_passages()  # parses the train split once (about 5 s)
    files = {key.split("#")[0] for key, _ in passages}
    assert len(passages) > 1000 and len(files) > 100
    assert all(split_of(key, 0.05, 0.05) == "train" for key in files)
    assert not files & {key for key, _ in held_out_stdlib_files()}
    for name in ("summarize", "context_qa", "extract"):
        prompts = prompt_sources.SOURCES[name]()
        assert len(prompts) == len(passages)
        assert all(passage in p.messages[0][1] for p, (_, passage) in zip(prompts, passages, strict=True))
    mixed = prompt_sources.load_prompts(["summarize", "writing", "explain"], max_prompts=6, seed=0)
    assert [p.id.split("/")[0] for p in mixed] == ["summarize", "writing", "explain"] * 2
