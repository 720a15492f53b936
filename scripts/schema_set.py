"""A JSONSchemaBench-style set of real JSON Schemas available offline, with prompts built from them.

    python scripts/schema_set.py [--model smollm2-135m-instruct]      # coverage report only

Sources (both pip packages, no network at run time):

* `check-jsonschema`'s vendored SchemaStore schemas (GitHub workflows and actions, Dependabot,
  ReadTheDocs, Renovate, GitLab CI, Travis, docker compose, ...) and its custom schema;
* `jsonschema-specifications`' meta-schemas (drafts 3 to 2020-12) and the 2019-09 / 2020-12
  vocabulary meta-schemas.

Each schema is compiled twice with llguidance: as warpdecode compiles it (`strict`), and with
llguidance's `lenient` and `coerce_one_of` options (`x-guidance`), which skip keywords it does not
implement (`not`, `uniqueItems`, `if`/`then`, ...) and read `oneOf` as `anyOf`: a lenient grammar may
allow invalid instances, so outputs are always validated with `jsonschema`. Coverage is the share
each mode compiles; the refused ones are listed with llguidance's reason.

Prompt (`prompt`): "Write a {title} document as JSON. {description} Reply with JSON only, valid against
this JSON Schema: {schema}", with the title from the schema's `title` (else its file name), the
description from its `description` (dropped if absent; cut to 300 characters), and the schema as
compact JSON cut to `schema_chars` characters (with "..." appended when cut: most SchemaStore schemas
are 10-190 kB, far beyond what a 135M model reads usefully).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

LENIENT = {"whitespace_flexible": False, "lenient": True, "coerce_one_of": True}
"""llguidance JSON options of the lenient mode (the schema's `x-guidance`)."""


@dataclass(frozen=True)
class Schema:
    name: str  # "vendor/github-workflows", "draft7/metaschema", "draft202012/vocabularies/core"
    schema: dict[str, Any]

    @property
    def size(self) -> int:
        return len(json.dumps(self.schema, separators=(",", ":")))

    def response_format(self, lenient: bool = False) -> dict[str, Any]:
        schema = {**self.schema, "x-guidance": LENIENT} if lenient else self.schema
        return {"type": "json_schema", "json_schema": {"name": self.name.replace("/", "_"), "schema": schema}}

    def prompt(self, schema_chars: int = 1500) -> str:
        title = self.schema.get("title") or Path(self.name).name
        description = self.schema.get("description")
        text = json.dumps(self.schema, separators=(",", ":"))
        if len(text) > schema_chars:
            text = text[:schema_chars] + "..."
        about = f" {' '.join(description.split())[:300]}" if isinstance(description, str) else ""
        return f"Write a {title} document as JSON.{about} Reply with JSON only, valid against this JSON Schema: {text}"


def schemas() -> list[Schema]:
    """Every schema of the set: SchemaStore and meta-schemas alternately, each smallest first (compact
    JSON size), so `--limit N` takes the N/2 smallest of each."""
    found: list[Schema] = []
    vendored = files("check_jsonschema.builtin_schemas")
    for folder in ("vendor", "custom"):
        for path in sorted((vendored / folder).iterdir(), key=lambda p: p.name):
            if path.name.endswith(".json"):
                found.append(Schema(f"{folder}/{path.name[:-5]}", json.loads(path.read_text())))
    meta: list[Schema] = []
    specs = files("jsonschema_specifications") / "schemas"
    for draft in sorted(specs.iterdir(), key=lambda p: p.name):
        meta.append(Schema(f"{draft.name}/metaschema", json.loads((draft / "metaschema.json").read_text())))
        vocabularies = draft / "vocabularies"
        if vocabularies.is_dir():
            for path in sorted(vocabularies.iterdir(), key=lambda p: p.name):
                meta.append(Schema(f"{draft.name}/vocabularies/{path.name}", json.loads(path.read_text())))
    found.sort(key=lambda s: (s.size, s.name))
    meta.sort(key=lambda s: (s.size, s.name))
    mixed = [s for pair in zip(found, meta, strict=False) for s in pair]
    return mixed + found[len(meta):] + meta[len(found):]


def compile_modes(schema: Schema, tokenizer: Any, vocab_size: int, stop_ids: set[int]) -> Iterator[tuple[str, str | None]]:
    """(mode, None) where llguidance compiles the schema, (mode, reason) where it refuses, for strict then lenient."""
    from warpdecode.decoding.constraints.formats import compile_response_format
    from warpdecode.errors import ConfigError

    for mode in ("strict", "lenient"):
        try:
            compile_response_format(schema.response_format(mode == "lenient"), tokenizer, vocab_size=vocab_size,
                                    stop_ids=stop_ids)
            yield mode, None
        except ConfigError as error:
            yield mode, str(error).removeprefix("cannot compile the response format: ")


def validate(text: str, schema: dict[str, Any], *, extract: bool = False) -> str:
    """"valid", "invalid" (parses, fails the schema), "not json" or "unverifiable" (a reference
    jsonschema cannot resolve offline). `extract` reads the first fenced block or the outermost
    {...} of free text (the unconstrained baseline) instead of the whole text."""
    import jsonschema
    import referencing.exceptions

    if extract:
        text = _extract(text)
    try:
        instance = json.loads(text)
    except ValueError:
        return "not json"
    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError:
        return "invalid"
    except (jsonschema.SchemaError, referencing.exceptions.Unresolvable):
        return "unverifiable"
    return "valid"


def _extract(text: str) -> str:
    if "```" in text:
        block = text.split("```")[1]
        return block.removeprefix("json").strip()
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if 0 <= start < end else text.strip()


def main() -> None:
    import warpdecode
    from warpdecode.decoding.generate import stop_token_ids

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    model, tokenizer = warpdecode.load(args.model)
    stops = stop_token_ids(model, tokenizer)
    counts = {"strict": 0, "lenient": 0}
    items = schemas()
    for item in items:
        row = [f"{item.name:40s} {item.size:7d} B"]
        for mode, reason in compile_modes(item, tokenizer, model.config.vocab_size, stops):
            counts[mode] += reason is None
            row.append(f"{mode}: {'ok' if reason is None else reason[:90]}")
        print("  ".join(row))
    print(f"\ncoverage: strict {counts['strict']}/{len(items)}, lenient {counts['lenient']}/{len(items)}")


if __name__ == "__main__":
    main()
