"""A bounded reader for the header of a GGUF file: metadata and tensor table, never tensor data.

Every count and length the file states is checked against the bytes that remain before it is used,
so a truncated or hostile header ends in one `CheckpointError` ("cannot read GGUF checkpoint PATH:
...") instead of a `struct.error` or a multi-gigabyte allocation. The shapes it returns let the
importer compare the metadata's sizes with the tensors before `transformers` builds anything.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warpdecode.errors import CheckpointError

GGUF_VERSIONS = (2, 3)
"""Version 1 counted in 32 bits; no reader in use still takes it."""

# Scalar metadata value types: type id -> struct format.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_SMALL_ARRAY = 64
"""Numeric arrays up to this length are kept as lists; longer ones (token scores) only as their length."""
_MAX_NAME = 1 << 16
_MAX_DIMS = 8

# ggml tensor types: type id -> (elements per block, bytes per block), as in ggml.h / gguf-py.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66),
}


class _Malformed(Exception):
    pass


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]
    """In torch order (outermost first; the file stores the innermost dimension first)."""
    ggml_type: int
    offset: int
    """From the start of the data section."""


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Any]
    """Scalars and strings as values; string arrays and long numeric arrays as their length."""
    tensors: dict[str, GgufTensor]
    data_start: int
    file_size: int


class _Reader:
    def __init__(self, data: mmap.mmap | bytes, size: int) -> None:
        self.data, self.size, self.pos = data, size, 0

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise _Malformed(f"truncated: {what} at byte {self.pos} needs {n} bytes, {self.size - self.pos} left")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, item_bytes: int) -> int:
        """A u64 count of items at least `item_bytes` long each, bounded by the bytes that remain."""
        n = int(self.scalar("<Q", what))
        if n * item_bytes > self.size - self.pos:
            raise _Malformed(f"{what} {n} needs more than the {self.size - self.pos} bytes left in the file")
        return n

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.count(f"length of {what}", 1)
        if limit is not None and n > limit:
            raise _Malformed(f"{what} is {n} bytes long (at most {limit})")
        start = self.take(n, what)
        try:
            return bytes(self.data[start : start + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Malformed(f"{what} at byte {start} is not UTF-8") from e

    def skip_string(self, what: str) -> None:
        self.take(self.count(f"length of {what}", 1), what)

    def value(self, value_type: int, key: str, depth: int = 0) -> Any:
        if value_type in _SCALARS:
            return self.scalar(_SCALARS[value_type], f"value of {key}")
        if value_type == _STRING:
            return self.string(f"value of {key}")
        if value_type != _ARRAY or depth > 2:
            raise _Malformed(f"metadata {key} has unknown value type {value_type}")
        element_type = int(self.scalar("<I", f"array type of {key}"))
        if element_type in _SCALARS:
            width = struct.calcsize(_SCALARS[element_type])
            n = self.count(f"array length of {key}", width)
            start = self.take(n * width, f"array {key}")
            if n > _SMALL_ARRAY:
                return n
            return list(struct.unpack_from(f"<{n}{_SCALARS[element_type][1:]}", self.data, start))
        if element_type == _STRING:
            n = self.count(f"array length of {key}", 8)
            for _ in range(n):
                self.skip_string(f"an element of {key}")
            return n
        n = self.count(f"array length of {key}", 12)
        for _ in range(n):
            self.value(element_type, key, depth + 1)
        return n


def read_gguf_header(path: Path) -> GgufHeader:
    """The metadata and tensor table of the GGUF file `path`, every size checked against the file."""
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 24:
                raise _Malformed(f"{size} bytes is too short for a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(_Reader(data, size))
    except _Malformed as e:
        raise CheckpointError(f"cannot read GGUF checkpoint {path}: {e}") from e
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"cannot read GGUF checkpoint {path}: {e}") from e


def _parse(r: _Reader) -> GgufHeader:
    start = r.take(4, "magic")
    if bytes(r.data[start : start + 4]) != b"GGUF":
        raise _Malformed("not a GGUF file (bad magic bytes)")
    version = int(r.scalar("<I", "version"))
    if version not in GGUF_VERSIONS:
        raise _Malformed(f"unsupported GGUF version {version} (supported: {', '.join(map(str, GGUF_VERSIONS))})")
    tensor_count = int(r.scalar("<Q", "tensor count"))
    kv_count = r.count("metadata count", 8 + 4 + 1)
    if tensor_count * (8 + 4 + 8 + 4 + 8) > r.size - r.pos:
        raise _Malformed(f"tensor count {tensor_count} needs more than the {r.size - r.pos} bytes left in the file")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = r.string("metadata key", _MAX_NAME)
        metadata[key] = r.value(int(r.scalar("<I", f"type of {key}")), key)
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(tensor_count):
        name = r.string("tensor name", _MAX_NAME)
        n_dims = int(r.scalar("<I", f"dimension count of {name}"))
        if not 1 <= n_dims <= _MAX_DIMS:
            raise _Malformed(f"tensor {name} has {n_dims} dimensions")
        dims = struct.unpack_from(f"<{n_dims}Q", r.data, r.take(8 * n_dims, f"shape of {name}"))
        ggml_type, offset = struct.unpack_from("<IQ", r.data, r.take(12, f"type and offset of {name}"))
        if min(dims) < 1:
            raise _Malformed(f"tensor {name} has an empty dimension {list(dims)}")
        infos.append((name, tuple(reversed(dims)), int(ggml_type), int(offset)))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise _Malformed(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-r.pos // alignment) * alignment
    tensors: dict[str, GgufTensor] = {}
    for name, shape, ggml_type, offset in infos:
        if name in tensors:
            raise _Malformed(f"tensor {name} is listed twice")
        tensors[name] = GgufTensor(name, shape, ggml_type, offset)
        if ggml_type not in GGML_BLOCKS:
            continue  # a type this table does not know: the dequantiser decides
        block, block_bytes = GGML_BLOCKS[ggml_type]
        elements = math.prod(shape)
        if shape[-1] % block:
            raise _Malformed(f"tensor {name} {list(shape)}: rows are not whole blocks of {block} (type {ggml_type})")
        end = data_start + offset + elements // block * block_bytes
        if end > r.size:
            raise _Malformed(f"tensor {name} {list(shape)} ends at byte {end}, past the end of the "
                             f"{r.size}-byte file (truncated?)")
    return GgufHeader(version, metadata, tensors, data_start, r.size)
