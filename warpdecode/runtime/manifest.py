"""The manifest of an inference package (`runtime.package` reads it, `export.package` writes it): its format,
and the schema every manifest is checked against before any field of it is used (types, required keys,
names that stay inside the package), with one-line `PackageIntegrityError`s that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import warpdecode
from warpdecode.errors import PackageIntegrityError

FORMAT = "warpdecode-package"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def short_name(value: Any) -> str:
    """A JSON value for a one-line message (`repr` escapes newlines), cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def safe_name(name: str) -> bool:
    """A relative POSIX path below the package: not absolute, no `..`, `.` or empty component, no backslash."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def validate_manifest(manifest: Any, where: Path) -> dict[str, Any]:
    """Check the manifest fields the runtime reads, before any is used: the format and its version,
    then each field's type and required keys (`files`: name → {sha256, bytes}; `target`: fingerprint
    and config; `backbone`: graph, hidden_layers and the optional fused_graph, embeds_graphs,
    variants, weight_aliases; `drafters`; `generation`) and that every file name stays inside the
    package. `PackageIntegrityError` naming the first bad field; `where`: the manifest's path."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackageIntegrityError(f"{where} is not a {FORMAT} manifest")

    def fail(label: str, what: str, value: Any) -> PackageIntegrityError:
        return PackageIntegrityError(f"{where}: manifest field {label} must be {what}, got {short_name(value)}")

    def get(parent: dict[str, Any], key: str, label: str, kind: type | tuple[type, ...], what: str,
            required: bool = True) -> Any:
        if key not in parent:
            if required:
                raise PackageIntegrityError(f"{where}: manifest field {label} is missing")
            return None
        value = parent[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise fail(label, what, value)
        return value

    def strings(value: dict[str, Any], label: str, names: bool = False) -> None:
        for key, item in value.items():
            if not isinstance(item, str) or (names and not safe_name(item)):
                raise fail(f"{label}[{key!r}]", "a relative path inside the package" if names else "a string", item)

    version = get(manifest, "format_version", "format_version", int, "an integer")
    if version != FORMAT_VERSION:
        raise PackageIntegrityError(
            f"{where.parent} has package format {version} (written by warpdecode {manifest.get('warpdecode_version')}); "
            f"this warpdecode {warpdecode.__version__} reads format {FORMAT_VERSION}"
            + ("; upgrade warpdecode" if version > FORMAT_VERSION else "; re-export it"))
    files = get(manifest, "files", "files", dict, "an object of file name → {sha256, bytes}")
    for name, entry in files.items():
        label = f"files[{name!r}]"
        if not safe_name(name):
            raise PackageIntegrityError(f"{where}: manifest field {label} names a path outside the package "
                                        f"(absolute, or with a '..' component); a package lists only its own files")
        if name == MANIFEST:
            raise PackageIntegrityError(f"{where}: manifest field {label} lists the manifest itself")
        get(files, name, label, dict, "an object {sha256, bytes}")
        digest = get(entry, "sha256", f"{label}.sha256", str, "a 64-digit hex string")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise fail(f"{label}.sha256", "a 64-digit lowercase hex string", digest)
        if get(entry, "bytes", f"{label}.bytes", int, "a non-negative integer") < 0:
            raise fail(f"{label}.bytes", "a non-negative integer", entry["bytes"])
    target = get(manifest, "target", "target", dict, "an object")
    get(target, "fingerprint", "target.fingerprint", str, "a string")
    get(target, "config", "target.config", dict, "an object (the model configuration)")
    backbone = get(manifest, "backbone", "backbone", dict, "an object")
    get(backbone, "graph", "backbone.graph", str, "a file name")
    layers = get(backbone, "hidden_layers", "backbone.hidden_layers", list, "a list of integers")
    if not all(isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in layers):
        raise fail("backbone.hidden_layers", "a list of non-negative integers", layers)
    get(backbone, "fused_graph", "backbone.fused_graph", (str, type(None)), "a file name or null", required=False)
    strings(get(backbone, "embeds_graphs", "backbone.embeds_graphs", dict, "an object", required=False) or {},
            "backbone.embeds_graphs")
    strings(get(backbone, "weight_aliases", "backbone.weight_aliases", dict, "an object", required=False) or {},
            "backbone.weight_aliases")
    variants = get(backbone, "variants", "backbone.variants", dict, "an object", required=False) or {}
    for kind, variant in variants.items():
        label = f"backbone.variants[{kind!r}]"
        get(variants, kind, label, dict, "an object {graph, backend, fused, accuracy}")
        get(variant, "graph", f"{label}.graph", str, "a file name")
        get(variant, "fused", f"{label}.fused", bool, "true or false", required=False)
    strings(get(manifest, "drafters", "drafters", dict, "an object", required=False) or {}, "drafters", names=True)
    get(manifest, "generation", "generation", dict, "an object", required=False)
    return manifest
