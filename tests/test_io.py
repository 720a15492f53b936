"""Atomic writes and hashing (`warpdecode.io`): a reader sees the old content or the whole new one."""

from __future__ import annotations

import hashlib
import json

import pytest

from warpdecode import io


def test_atomic_file_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sub" / "a.json"
    io.atomic_file(path, lambda f: f.write(b"old"))
    with pytest.raises(RuntimeError, match="half way"):
        io.atomic_file(path, lambda f: (f.write(b"new, half"), (_ for _ in ()).throw(RuntimeError("half way"))))
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]  # no temporary sibling left
    io.atomic_file(path, lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new"


def test_atomic_directory_replaces_an_output_and_cleans_up_after_an_error(tmp_path):
    out = tmp_path / "out"
    with io.atomic_directory(out) as tmp:
        (tmp / "x").write_text("1")
    with pytest.raises(ValueError), io.atomic_directory(out) as tmp:
        (tmp / "x").write_text("2")
        raise ValueError
    assert (out / "x").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with io.atomic_directory(out) as tmp:
        (tmp / "y").write_text("3")
    assert sorted(p.name for p in out.iterdir()) == ["y"]


def test_a_cache_entry_completed_first_by_another_writer_is_kept(tmp_path):
    entry = tmp_path / "entry"
    with io.atomic_directory(entry, replace=False) as tmp:
        (tmp / "mine").write_text("late")
        entry.mkdir()  # another process finished the same entry meanwhile
        (entry / "theirs").write_text("first")
    assert sorted(p.name for p in entry.iterdir()) == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_sha256_file_reads_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "HASH_CHUNK", 7)
    data = bytes(range(256)) * 5
    (tmp_path / "f").write_bytes(data)
    assert io.sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_content_key_is_the_sorted_json_hash():
    assert io.content_key({"b": 1, "a": [2, 3]}) == io.content_key({"a": [2, 3], "b": 1})
    assert io.content_key({"a": 1}) != io.content_key({"a": 2}) and len(io.content_key("x")) == 24
    settings = [1, "fingerprint", 0, 128, 1.0, 0.95, 128]  # self-chat's key: a list, as before sort_keys
    assert io.content_key(settings) == hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:24]
