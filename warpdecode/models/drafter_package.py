"""Trained drafters on disk: `drafter.safetensors` plus `drafter.json`, naming the target they were trained for.

    drafter.json = {
      "format": "warpdecode-drafter", "version": 1,
      "kind": "eagle",                       # the registered drafter that runs it
      "target": {"source": "smollm2-135m-instruct", "fingerprint": "85281c25dd61e4f8", ...},
      "config": {...},                       # the architecture arguments of the network
      "tree": {"rank_paths": [[0], [0, 0], [1], ...]},   # the draft tree built from data
      "training": {...}                      # what it cost and what validation measured
    }

Loading checks the file set, the format version and the target's fingerprint
(`models.identity`), and refuses a mismatch with a `CheckpointError` that says which target the
drafter wants: a drafter run on another model drafts garbage without any error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from warpdecode.errors import CheckpointError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import atomic_directory

FORMAT = "warpdecode-drafter"
VERSION = 1
META_FILE = "drafter.json"
WEIGHTS_FILE = "drafter.safetensors"


@dataclass
class DrafterPackage:
    kind: str
    target: dict[str, Any]
    """`source` (how the target was named when training), `fingerprint`, `vocab_size`, `d_model`, `n_layer`."""
    config: dict[str, Any]
    weights: dict[str, Tensor]
    tree: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def describe_target(target: Backbone, source: str) -> dict[str, Any]:
        return {"source": source, "fingerprint": target.fingerprint(), "vocab_size": target.config.vocab_size,
                "d_model": target.config.d_model, "n_layer": target.config.n_layer}

    def check_target(self, target: Backbone) -> None:
        """Raise CheckpointError unless `target` is the model this drafter was trained for."""
        found = target.fingerprint()
        if found != self.target["fingerprint"]:
            raise CheckpointError(
                f"this {self.kind} drafter was trained for {self.target['source']!r} (fingerprint "
                f"{self.target['fingerprint']}, {self.target['n_layer']} layers, d_model {self.target['d_model']}), "
                f"but the target is another model (fingerprint {found}, {target.config.n_layer} layers, "
                f"d_model {target.config.d_model}); train a drafter for this target with `warpdecode fit`"
            )

    def save(self, directory: str | Path) -> Path:
        """Write atomically: a half-written package never appears under `directory`."""
        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            meta = {"format": FORMAT, "version": VERSION, "kind": self.kind, "target": self.target,
                    "config": self.config, "tree": self.tree, "training": self.training}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            save_file({k: v.detach().contiguous().cpu() for k, v in self.weights.items()}, str(tmp / WEIGHTS_FILE))
        return directory

    @classmethod
    def load(cls, directory: str | Path, kind: str | None = None) -> DrafterPackage:
        """Load and check a package; `kind`: the drafter kind it must hold (None: any)."""
        directory = Path(directory)
        meta_path, weights_path = directory / META_FILE, directory / WEIGHTS_FILE
        for path in (meta_path, weights_path):
            if not path.is_file():
                raise CheckpointError(f"{directory} is not a drafter package: {path.name} is missing "
                                      f"(train one with `warpdecode fit` and a recipe from configs/)")
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{meta_path} is not valid JSON: {e}") from e
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise CheckpointError(f"{meta_path}: expected format {FORMAT!r} version {VERSION}, got "
                                  f"{meta.get('format')!r} version {meta.get('version')}")
        if kind is not None and meta.get("kind") != kind:
            raise CheckpointError(f"{directory} holds a {meta.get('kind')!r} drafter, not {kind!r}")
        try:
            weights = load_file(str(weights_path))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{weights_path} is corrupt or truncated: {e}") from e
        return cls(meta["kind"], meta["target"], meta["config"], weights, meta.get("tree", {}), meta.get("training", {}))
