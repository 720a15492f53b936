"""Malformed checkpoints, configs, tokenizers and chat templates end in one-line errors, quickly and
without large allocations: never a traceback, a hang or a MemoryError."""

from __future__ import annotations

import json
import resource
import shutil
import struct
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from warpdecode.cli import main
from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models import config as config_module
from warpdecode.models import tokenizer as tokenizer_module
from warpdecode.models.checkpoint import WEIGHTS_FILE, load_pretrained, read_config, save_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.importers.gguf import read_gguf
from warpdecode.models.importers.gguf_header import read_gguf_header
from warpdecode.models.tokenizer import Tokenizer, char_tokenizer
from warpdecode.models.transformer import Transformer

pytestmark = pytest.mark.usefixtures("single_thread")

ALPHABET = "abcdefghij "


HANG_SECONDS = 60.0
"""What counts as a hang: the cases take milliseconds, and a loaded machine must not fail them."""


@contextmanager
def cheap(seconds: float = HANG_SECONDS, megabytes: int = 100, resident_megabytes: int = 1024) -> Iterator[None]:
    """The block ends within `seconds`, its Python heap peak stays under `megabytes` and the process's
    peak resident size grows by less than `resident_megabytes` (first-time imports and torch's own
    start-up take some; the allocations this guards against take gigabytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    start = time.monotonic()
    try:
        yield
    finally:
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
        assert elapsed < seconds, f"took {elapsed:.1f} s"
        assert peak < megabytes << 20, f"allocated {peak >> 20} MiB"
        assert grown < resident_megabytes << 10, f"resident size grew by {grown >> 10} MiB"


# --- a tiny checkpoint to break ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer(ALPHABET)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=64)
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights()
    directory = tmp_path_factory.mktemp("pristine") / "model"
    save_pretrained(model, tokenizer, directory)
    return directory


@pytest.fixture
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    shutil.copytree(pristine, directory)
    return directory


def edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_the_pristine_checkpoint_loads(ckpt: Path) -> None:
    model, tokenizer = load_pretrained(ckpt)
    assert model.config.n_layer == 2 and tokenizer.vocab_size == model.config.vocab_size


# --- config.json --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": 10_000_000}, r"vocab_size=10000000 but model\.embed_tokens\.weight is \(13, 16\)"),
        ({"num_hidden_layers": 4000}, "num_hidden_layers=4000 but the weights hold 2 layers"),
        ({"num_hidden_layers": 1_000_000}, "num_hidden_layers=1000000 is beyond any real model"),
        ({"hidden_size": 4096, "head_dim": None}, r"hidden_size=4096 but model\.embed_tokens\.weight is \(13, 16\)"),
        ({"intermediate_size": 500_000}, r"intermediate_size=500000 but model\.layers\.0\.mlp\.gate_proj\.weight"),
        ({"num_attention_heads": 4, "num_key_value_heads": 4},
         r"num_attention_heads × head_dim \(4 × 8\)=32 but model\.layers\.0\.self_attn\.q_proj\.weight is \(16, 16\)"),
        ({"num_key_value_heads": 1}, r"num_key_value_heads × head_dim \(1 × 8\)=8 but .*k_proj\.weight is \(16, 16\)"),
        ({"vocab_size": "13"}, "field 'vocab_size' must be an integer, got '13'"),
        ({"hidden_size": 16.0}, "field 'hidden_size' must be an integer, got 16.0"),
        ({"tie_word_embeddings": "yes"}, "field 'tie_word_embeddings' must be true or false"),
        ({"rms_norm_eps": [1]}, "field 'rms_norm_eps' must be a number"),
        ({"eos_token_id": "x"}, "field 'eos_token_id' must be an integer or a list of them"),
        ({"num_attention_heads": 0}, "num_attention_heads must be positive, got 0"),
        ({"vocab_size": -5}, "vocab_size must be positive, got -5"),
        ({"num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": None}, "hidden_size=16 is not divisible by num_attention_heads=3"),
        ({"num_key_value_heads": 3}, "num_attention_heads=2 is not a multiple of num_key_value_heads=3"),
        ({"max_position_embeddings": 10**12}, "max_position_embeddings=1000000000000 is beyond any real model"),
        ({"rope_theta": -1.0}, "rope_theta must be a finite positive number"),
        ({"rope_scaling": [1, 2]}, "field 'rope_scaling' must be an object"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks 'original_max_position_embeddings'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": "big"}}, "factor must be a finite positive number"),
        ({"rope_parameters": "x", "rope_theta": None}, "must be a number|'rope_parameters' must be an object"),
    ],
)
def test_bad_config_json_is_refused_before_anything_is_built(ckpt: Path, changes: dict[str, Any], message: str) -> None:
    edit_config(ckpt, **changes)
    with cheap(), pytest.raises(CheckpointError, match=message) as info:
        load_pretrained(ckpt)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"model_type": "llama", ', "corrupt .*config.json"),
        ("[1, 2]", "must hold a JSON object, got list"),
        ("null", "must hold a JSON object, got NoneType"),
        ("[" * 100_000 + "]" * 100_000, "corrupt .*config.json"),
        ('{"model_type": "llama", "vocab_size": 13}', "lacks field 'num_attention_heads'"),
        ('{"model_type": "bert"}', "unsupported model_type 'bert'"),
    ],
)
def test_unreadable_config_json(ckpt: Path, text: str, message: str) -> None:
    (ckpt / "config.json").write_text(text)
    with cheap(), pytest.raises(CheckpointError, match=message):
        read_config(ckpt)
    (ckpt / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="corrupt .*config.json"):
        read_config(ckpt)


def test_config_with_fewer_layers_names_the_unexpected_weights(ckpt: Path) -> None:
    edit_config(ckpt, num_hidden_layers=1)
    with pytest.raises(CheckpointError, match=r"unexpected \['blocks\.1\."):
        load_pretrained(ckpt)


def test_gpt2_config_is_checked_against_its_tensors(tmp_path: Path) -> None:
    tokenizer = char_tokenizer(ALPHABET)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=20,
                         norm="layernorm", mlp="gelu_tanh", position="learned", qkv_bias=True, out_bias=True,
                         mlp_bias=True, family="gpt2")
    save_pretrained(Transformer(config), tokenizer, tmp_path / "gpt2")
    load_pretrained(tmp_path / "gpt2")
    for changes, message in (({"n_positions": 10**6}, r"n_positions=1000000 but transformer\.wpe\.weight is \(20, 16\)"),
                             ({"n_inner": 64}, r"n_inner=64 but transformer\.h\.0\.mlp\.c_fc\.weight is \(16, 32\)"),
                             ({"n_layer": 3}, "n_layer=3 but the weights hold 1 layers")):
        shutil.copytree(tmp_path / "gpt2", tmp_path / "broken", dirs_exist_ok=True)
        edit_config(tmp_path / "broken", **(json.loads((tmp_path / "gpt2" / "config.json").read_text()) | changes))
        with pytest.raises(CheckpointError, match=message):
            load_pretrained(tmp_path / "broken")


# --- safetensors --------------------------------------------------------------------------------------------


def safetensors_bytes(header: dict[str, Any] | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


@pytest.mark.parametrize(
    "content",
    [
        "truncated",
        b"",
        b"\x01\x02\x03",
        safetensors_bytes(b"\xff\xfe not json at all"),
        safetensors_bytes(b"[1, 2, 3]"),
        safetensors_bytes(b"{}", length=1 << 62),  # a header length beyond the file
        safetensors_bytes({"w": {"dtype": "F32", "shape": [100_000, 100_000], "data_offsets": [0, 16]}}, b"\0" * 16),
        safetensors_bytes({"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]}}, b"\0" * 16),
        safetensors_bytes({"w": {"dtype": "F32", "shape": [10_000, 10_000], "data_offsets": [0, 400_000_000]}},
                          b"\0" * 16),
        safetensors_bytes({"w": {"dtype": "XX", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16),
    ],
    ids=["truncated", "empty", "short", "garbage", "not-an-object", "huge-header", "lying-shape", "overflow",
         "lying-offsets", "bad-dtype"],
)
def test_malformed_safetensors(ckpt: Path, content: str | bytes) -> None:
    weights = ckpt / WEIGHTS_FILE
    if content == "truncated":
        content = weights.read_bytes()[: weights.stat().st_size - 100]
    assert isinstance(content, bytes)
    weights.write_bytes(content)
    with cheap(), pytest.raises(CheckpointError, match=f"corrupt weights file .*{WEIGHTS_FILE}") as info:
        load_pretrained(ckpt)
    assert "\n" not in str(info.value)


def test_weights_of_the_wrong_shape_deeper_in_the_model(ckpt: Path) -> None:
    weights = load_file(ckpt / WEIGHTS_FILE)
    weights["model.layers.1.mlp.down_proj.weight"] = torch.zeros(16, 30)
    save_file(weights, ckpt / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match="do not match its config.json: .*down_proj") as info:
        load_pretrained(ckpt)
    assert "\n" not in str(info.value)


def test_config_too_large_for_memory_is_refused(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "physical_memory_bytes", lambda: 1000)
    with pytest.raises(CheckpointError, match="needs 0.0 GiB for its .* parameters, more than this machine's"):
        load_pretrained(ckpt)


# --- tokenizer files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("tokenizer.json", "{{{", "cannot read tokenizer .*tokenizer.json: key must be a string"),
        ("tokenizer.json", "[]", "cannot read tokenizer .*tokenizer.json: invalid type"),
        ("tokenizer.json", "{}", "cannot read tokenizer .*tokenizer.json: Model missing"),
        ("tokenizer.json", '{"model": {"type": "BPE", "vocab": 3, "merges": []}}', "cannot read tokenizer"),
        ("tokenizer_config.json", "{", "cannot read tokenizer .*tokenizer_config.json"),
        ("tokenizer_config.json", "[]", "tokenizer_config.json: expected a JSON object, got list"),
        ("tokenizer_config.json", '{"eos_token": 5}', "eos_token must be a string, got 5"),
        ("tokenizer_config.json", '{"bos_token": {"content": []}}', "bos_token must be a string"),
        ("tokenizer_config.json", '{"chat_template": 7}', "chat_template must be a string or a list"),
        ("tokenizer_config.json", '{"chat_template": [1, {"name": "x"}]}', None),
    ],
)
def test_malformed_tokenizer_files(ckpt: Path, name: str, content: str, message: str | None) -> None:
    (ckpt / name).write_text(content)
    if message is None:  # no default among the named templates: no chat template
        assert Tokenizer.load(ckpt).chat_template is None
        return
    with cheap(), pytest.raises(CheckpointError, match=message) as info:
        load_pretrained(ckpt)
    assert "\n" not in str(info.value)


def test_tokenizer_larger_than_the_model_vocabulary(ckpt: Path) -> None:
    char_tokenizer(ALPHABET + "klmnop").save(ckpt)
    with pytest.raises(CheckpointError, match="has 19 tokens, more than the model's vocab_size=13"):
        load_pretrained(ckpt)


# --- chat templates -----------------------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hi"}]


def render(template: str) -> str:
    tokenizer = char_tokenizer(ALPHABET)
    tokenizer.chat_template = template
    return tokenizer.apply_chat_template(MESSAGES)


@pytest.mark.parametrize(
    "template, message",
    [
        ("{% for m in messages %}", "Unexpected end of template"),
        ("{{ 1 +* 2 }}", "unexpected"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "too many steps"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{{ '0123456789' * 10 }}{% endfor %}{% endfor %}",
         "output longer than 1048576 characters"),
        ("{{ 'a' * 10**9 }}", "would build a value of 1000000000"),
        ("{{ ['a'] * 10**9 }}", "would build a value of 1000000000"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
         "builds a value longer than"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
         "would build a value of"),
        ("{{ 'x'|center(10**9) }}", "would build a value of 1000000000"),
        ("{{ 'x'.ljust(10**9) }}", "would build a value of 1000000000"),
        ("{{ '{:>1000000000}'.format('x') }}", "would build a value of 1000000000"),
        ("{{ '%1000000000s' % 'x' }}", "would build a value of 1000000000"),
        ("{{ '%1000000000s'|format('x') }}", "would build a value of 1000000000"),
        ("{% set s = 'x' * 1000000 %}{{ s.replace('x', s) }}", "would build a value of 1000001000000"),
        ("{% set s = 'x' * 1000000 %}{{ s|replace('x', s) }}", "would build a value of 1000001000000"),
        ("{% set s = 'x' * 1000000 %}{{ (['a'] * 1000000)|join(s) }}", "would build a value of"),
        ("{% set s = 'x' * 1000000 %}{{ s.join(['a'] * 1000000) }}", "would build a value of"),
        ("{% set s = '\n' * 1000000 %}{{ s|indent(1000000) }}", "would build a value of"),
        ("{% set s = '\t' * 1000000 %}{{ s.expandtabs(1000000) }}", "would build a value of"),
        ("{{ 2 ** 100000000 }}", r"2 \*\* 100000000 is too large"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
        ("{{ 1 / 0 }}", "division by zero"),
        ("{{ raise_exception('no system messages') }}", "no system messages"),
        ("{{ ''.__class__.__mro__ }}", "unsafe"),
        ("{{ messages.append(1) }}", "unsafe"),
        ("{{ 1 }}" * 200_000, "its source is 1400000 characters long"),
    ],
)
def test_bad_chat_template_is_one_line(template: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError, match="^chat template failed: .*" + message) as info:
        render(template)
    assert time.monotonic() - start < HANG_SECONDS
    assert "\n" not in str(info.value)


def test_chat_template_wall_clock_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer_module, "TEMPLATE_SECONDS", 0.3)
    start = time.monotonic()
    with pytest.raises(ConfigError, match="chat template failed: still rendering after 0.3 s"):
        render("{% for i in range(100000) %}{{ (range(100000)|list|sum) and '' }}{% endfor %}")
    assert time.monotonic() - start < HANG_SECONDS


def test_ordinary_chat_templates_still_render() -> None:
    template = ("{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}<|{{ m['role'] }}|>\n"
                "{{ m['content'] | trim }}{{ '\n' ~ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|assistant|>' + '\n' }}{% endif %}")
    assert render(template) == "<|user|>\nhi\n<|endoftext|><|assistant|>\n"
    long = [{"role": "user", "content": "word " * 400_000}]  # 2 MB: the limit grows with the input
    tokenizer = char_tokenizer(ALPHABET)
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}"
    assert len(tokenizer.apply_chat_template(long)) == 4_000_000


# --- GGUF ---------------------------------------------------------------------------------------------------

U32, F32_VALUE, BOOL, STRING, ARRAY, U64 = 4, 6, 7, 8, 9, 10


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", BOOL, value)
    if isinstance(value, int):
        return struct.pack("<IQ", U64, value)
    if isinstance(value, float):
        return struct.pack("<If", F32_VALUE, value)
    if isinstance(value, str):
        return struct.pack("<I", STRING) + gguf_string(value)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return struct.pack("<IIQ", ARRAY, STRING, len(value)) + b"".join(gguf_string(v) for v in value)


def gguf_bytes(metadata: dict[str, Any], tensors: dict[str, tuple[int, ...]]) -> bytes:
    """A GGUF v3 file of float32 zeros (shapes in torch order)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    out += b"".join(gguf_string(k) + gguf_value(v) for k, v in metadata.items())
    offset, data = 0, b""
    for name, shape in tensors.items():
        out += gguf_string(name) + struct.pack(f"<I{len(shape)}Q", len(shape), *reversed(shape))
        out += struct.pack("<IQ", 0, offset)
        size = 4 * int(torch.tensor(shape).prod())
        data += b"\0" * size
        offset += size
    out += b"\0" * (-len(out) % 32)
    return out + data


def tiny_gguf(**overrides: Any) -> bytes:
    """A consistent one-block llama GGUF (8 tokens, width 8) with `overrides` applied to its metadata."""
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": 1,
        "llama.context_length": 32,
        "llama.embedding_length": 8,
        "llama.feed_forward_length": 16,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(8)],
    } | overrides
    tensors = {"token_embd.weight": (8, 8), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8),
               "blk.0.ffn_up.weight": (16, 8), "output_norm.weight": (8,)}
    return gguf_bytes({k: v for k, v in metadata.items() if v is not None}, tensors)


@pytest.fixture
def hf_extra() -> None:
    """`read_gguf` needs transformers: imported here, outside the tests' time and memory bounds."""
    pytest.importorskip("transformers")


def test_the_tiny_gguf_header_reads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_gguf())
    header = read_gguf_header(path)
    assert header.metadata["tokenizer.ggml.tokens"] == 8 and header.tensors["blk.0.ffn_up.weight"].shape == (16, 8)


HUGE = 1 << 60


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "too short for a GGUF header"),
        (b"GGUF\x03\x00\x00", "too short for a GGUF header"),
        (b"GGML" + b"\0" * 100, "not a GGUF file"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "unsupported GGUF version 1"),
        (b"GGUF" + struct.pack("<IQQ", 3, HUGE, 0), f"tensor count {HUGE} needs more than"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, HUGE), f"metadata count {HUGE} needs more than"),
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, HUGE) + b"key" + b"\0" * 20, f"length of metadata key {HUGE} needs more than"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<IQ", STRING, HUGE),
         "length of value of k"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<IIQ", ARRAY, STRING, HUGE),
         f"array length of k {HUGE} needs more than"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<IIQ", ARRAY, U32, HUGE),
         f"array length of k {HUGE} needs more than"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<I", 99) + b"\0" * 8,
         "unknown value type 99"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("t") + struct.pack("<I", 1000) + b"\0" * 20,
         "tensor t has 1000 dimensions"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string(b"\xff\xfe") + gguf_value(1), "is not UTF-8"),
        ("truncated-metadata", "truncated: value of llama.feed_forward_length at byte 225 needs 8 bytes, 4 left"),
        ("truncated-data", r"tensor output_norm\.weight \[8\] ends at byte .* past the end"),
        ("huge-tensor", r"tensor token_embd\.weight \[1048576, 1048576\] ends at byte"),
    ],
)
@pytest.mark.usefixtures("hf_extra")
def test_malformed_gguf_header(tmp_path: Path, content: str | bytes, message: str) -> None:
    if content == "truncated-metadata":
        content = tiny_gguf()[:229]
    elif content == "truncated-data":
        content = tiny_gguf()[:-4]
    elif content == "huge-tensor":
        whole = tiny_gguf()
        content = whole.replace(struct.pack("<QQ", 8, 8), struct.pack("<QQ", 1 << 20, 1 << 20), 1)
    assert isinstance(content, bytes)
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with cheap(), pytest.raises(CheckpointError, match=f"^cannot read GGUF checkpoint {path}: .*{message}") as info:
        read_gguf(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"llama.block_count": 1_000_000}, "llama.block_count=1000000 but the file holds tensors of 1 blocks"),
        ({"llama.embedding_length": 1 << 20}, r"llama.embedding_length=1048576 but tensor token_embd.weight is \[8, 8\]"),
        ({"tokenizer.ggml.tokens": [f"t{i}" for i in range(9)]}, "tokenizer.ggml.tokens=9 but tensor token_embd.weight"),
        ({"llama.vocab_size": 40_000_000_000}, "llama.vocab_size=40000000000 but tensor token_embd.weight"),
        ({"llama.feed_forward_length": 12}, r"llama.feed_forward_length=12 but tensor blk.0.ffn_up.weight is \[16, 8\]"),
        ({"llama.attention.head_count": 4}, r"head_count_kv × head dim 2=2 but tensor blk.0.attn_k.weight is \[4, 8\]"),
        ({"llama.attention.head_count_kv": 2}, r"head_count_kv × head dim 4=8 but tensor blk.0.attn_k.weight is \[4, 8\]"),
        ({"llama.attention.head_count": 3}, "embedding_length=8 is not divisible by llama.attention.head_count=3"),
        ({"llama.attention.head_count": 0}, "llama.attention.head_count must be a positive integer, got 0"),
        ({"llama.block_count": "one"}, "llama.block_count must be a positive integer, got 'one'"),
        ({"llama.context_length": 1 << 40}, "llama.context_length=1099511627776 is beyond any real model"),
        ({"general.architecture": "bert"}, "unsupported GGUF architecture 'bert'"),
    ],
)
@pytest.mark.usefixtures("hf_extra")
def test_gguf_metadata_is_checked_against_its_tensors(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_gguf(**overrides))
    with cheap(), pytest.raises(CheckpointError, match=message):
        read_gguf(path)


@pytest.mark.usefixtures("hf_extra")
def test_gguf_the_reader_refuses_is_one_line(tmp_path: Path) -> None:
    """A header that passes the checks but that `transformers` cannot load (no tokenizer model)."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_gguf(**{"tokenizer.ggml.model": None}))
    with pytest.raises(CheckpointError, match=f"^cannot read GGUF checkpoint {path}: ") as info:
        read_gguf(path)
    assert "\n" not in str(info.value)


@pytest.mark.usefixtures("hf_extra")
def test_gguf_too_large_for_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warpdecode.models.importers.gguf as gguf_module

    monkeypatch.setattr(gguf_module, "physical_memory_bytes", lambda: 100)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_gguf())
    with pytest.raises(CheckpointError, match="dequantises to 0.0 GiB of float32 weights, more than this machine's"):
        read_gguf(path)


# --- ModelConfig without a checkpoint -----------------------------------------------------------------------


def test_model_config_from_dict_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match="must be a mapping of fields, got list"):
        ModelConfig.from_dict([1])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"lacks fields \['d_ff'\]"):
        ModelConfig.from_dict({"vocab_size": 8, "n_layer": 1, "n_head": 1, "d_model": 8})
    with pytest.raises(ConfigError, match="n_layer must be an integer, got '2'"):
        ModelConfig.from_dict({"vocab_size": 8, "n_layer": "2", "n_head": 1, "d_model": 8, "d_ff": 8})
    with pytest.raises(ConfigError, match="eos_token_ids must be a list of integers"):
        ModelConfig(vocab_size=8, n_layer=1, n_head=1, d_model=8, d_ff=8, eos_token_ids=[1.5])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="mask_token_id=8 is not a token id"):
        ModelConfig(vocab_size=8, n_layer=1, n_head=1, d_model=8, d_ff=8, mask_token_id=8)
    with pytest.raises(ConfigError, match="causal must be true or false"):
        ModelConfig(vocab_size=8, n_layer=1, n_head=1, d_model=8, d_ff=8, causal=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_parameter_count_is_exact(family: str) -> None:
    extra: dict[str, Any] = {"llama": {"n_kv_head": 1, "head_dim": 16, "mlp_bias": True, "tie_embeddings": False},
                             "qwen2": {"n_kv_head": 2, "qkv_bias": True, "family": "qwen2"},
                             "gpt2": {"norm": "layernorm", "mlp": "gelu_tanh", "position": "learned", "qkv_bias": True,
                                      "out_bias": True, "mlp_bias": True, "family": "gpt2"}}[family]
    config = ModelConfig(vocab_size=20, n_layer=2, n_head=4, d_model=32, d_ff=48, max_seq_len=24, **extra)
    assert config.parameter_count() == sum(p.numel() for p in Transformer(config).parameters())


def test_random_weights_beyond_memory_are_refused_without_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "physical_memory_bytes", lambda: 1 << 30)
    config = ModelConfig(vocab_size=1 << 24, n_layer=4, n_head=8, d_model=4096, d_ff=8192)  # 600 GB of logits head
    with cheap(), pytest.raises(ConfigError, match="needs .* GiB for its .* parameters, more than this machine's 1.0 GiB"):
        Transformer(config)
    with torch.device("meta"):  # a meta model (checkpoint loading) allocates nothing and is not refused
        Transformer(config)


# --- the command line: one line on stderr, exit status 2 ----------------------------------------------------


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0), capsys.readouterr().err


def assert_one_line(code: int, err: str, message: str) -> None:
    assert code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err


def test_cli_absurd_config_sizes(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_config(ckpt, vocab_size=10_000_000)
    start = time.monotonic()
    code, err = run_cli(["generate", "--model", str(ckpt), "--prompt", "abc", "--max-new-tokens", "2"], capsys)
    assert_one_line(code, err, "vocab_size=10000000 but model.embed_tokens.weight is (13, 16)")
    edit_config(ckpt, vocab_size=13, num_hidden_layers=1_000_000)
    code, err = run_cli(["generate", "--model", str(ckpt), "--prompt", "abc", "--max-new-tokens", "2"], capsys)
    assert_one_line(code, err, "num_hidden_layers")
    assert time.monotonic() - start < HANG_SECONDS


def test_cli_malformed_tokenizer_and_weights(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ckpt / "tokenizer.json").write_text("not json")
    code, err = run_cli(["generate", "--model", str(ckpt), "--prompt", "abc", "--max-new-tokens", "2"], capsys)
    assert_one_line(code, err, "cannot read tokenizer")
    (ckpt / WEIGHTS_FILE).write_bytes(safetensors_bytes(b"{}", length=1 << 62))
    code, err = run_cli(["generate", "--model", str(ckpt), "--prompt", "abc", "--max-new-tokens", "2"], capsys)
    assert_one_line(code, err, "corrupt weights file")


def test_cli_looping_chat_template(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    (ckpt / "tokenizer_config.json").write_text(json.dumps(config))
    code, err = run_cli(["generate", "--model", str(ckpt), "--prompt", "abc", "--chat", "true",
                         "--max-new-tokens", "2"], capsys)
    assert_one_line(code, err, "chat template failed: too many steps")


@pytest.mark.parametrize("content", [b"GGUF" + struct.pack("<IQQ", 3, HUGE, 0), "truncated", "layers"])
@pytest.mark.usefixtures("hf_extra")
def test_cli_malformed_gguf(content: str | bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WARPDECODE_CACHE", str(tmp_path / "cache"))
    if content == "truncated":
        content = tiny_gguf()[:100]
    elif content == "layers":
        content = tiny_gguf(**{"llama.block_count": 1_000_000})
    assert isinstance(content, bytes)
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    code, err = run_cli(["generate", "--model", str(path), "--prompt", "abc"], capsys)
    assert_one_line(code, err, f"{path}")
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())
