"""Trained drafters on disk: `drafter.safetensors` plus `drafter.json`, naming the target they were trained for.

    drafter.json = {
      "format": "warpdecode-drafter", "version": 1,
      "kind": "eagle",                       # the registered drafter that runs it
      "target": {"source": "smollm2-135m-instruct", "fingerprint": "85281c25dd61e4f8", ...},
      "config": {...},                       # the architecture arguments of the network
      "tree": {"rank_paths": [[0], [0, 0], [1], ...]},   # the draft tree built from data
      "training": {...}                      # what it cost and what validation measured
    }

Loading checks the file set (inside the directory: no symbolic link out of it), the schema of
drafter.json (`validate_meta`), the format version and the target's fingerprint
(`models.identity`), and refuses a mismatch with a `CheckpointError` that says which target the
drafter wants: a drafter run on another model drafts garbage without any error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.io import atomic_directory
from warpdecode.models.backbone import Backbone
from warpdecode.models.draft_head import DraftVocabNet

FORMAT = "warpdecode-drafter"
VERSION = 1
META_FILE = "drafter.json"
WEIGHTS_FILE = "drafter.safetensors"

NetT = TypeVar("NetT", bound=DraftVocabNet)


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
                f"this {self.kind} drafter was trained for {self.target.get('source')!r} (fingerprint "
                f"{self.target['fingerprint']}, {self.target.get('n_layer')} layers, "
                f"d_model {self.target.get('d_model')}), "
                f"but the target is another model (fingerprint {found}, {target.config.n_layer} layers, "
                f"d_model {target.config.d_model}); train a drafter for this target with `warpdecode fit`"
            )

    def load_net(self, target: Backbone, net_class: type[NetT], where: str | Path = "drafter package") -> NetT:
        """The trained network of this package for `target` (checked to be the target it was trained for,
        `CheckpointError` otherwise): `net_class` built from the package's typed config
        (`from_package_config`), the weights loaded and the frozen head rebuilt from the target (unless
        the package stores its own, `stores_head`); on the
        target's device and dtype, in eval mode. `where`: the package, for messages."""
        self.check_target(target)
        with torch.inference_mode(False):  # drafters prepare under inference mode; packing needs normal tensors
            net = net_class.from_package_config(target.config, self.config, f"{where}/{META_FILE}")
            missing, unexpected = net.load_state_dict(self.weights, strict=False)
            if unexpected or set(missing) != (set() if net.stores_head else {net.head_key}):
                raise ConfigError(f"{where}: drafter weights do not match its config "
                                  f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
            if not net.stores_head:
                net.tie_head(target)
            return net.to(device=target.embed.weight.device, dtype=target.embed.weight.dtype).eval()

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
        """Load and check a package; `kind`: the drafter kind it must hold (None: any). Its files must
        lie inside `directory` (symlinks resolved) and drafter.json must match the schema
        (`validate_meta`); `CheckpointError` otherwise."""
        directory = Path(directory)
        meta_path, weights_path = directory / META_FILE, directory / WEIGHTS_FILE
        for path in (meta_path, weights_path):
            if not path.is_file():
                raise CheckpointError(f"{directory} is not a drafter package: {path.name} is missing "
                                      f"(train one with `warpdecode fit` and a recipe from configs/)")
            if not path.resolve().is_relative_to(directory.resolve()):
                raise CheckpointError(f"{path} resolves to {path.resolve()}, outside its drafter package")
        try:
            meta = validate_meta(json.loads(meta_path.read_text()), meta_path)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{meta_path} is not valid JSON: {e}") from e
        if kind is not None and meta["kind"] != kind:
            raise CheckpointError(f"{directory} holds a {meta['kind']!r} drafter, not {kind!r}")
        try:
            weights = load_file(str(weights_path))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{weights_path} is corrupt or truncated: {e}") from e
        return cls(meta["kind"], meta["target"], meta["config"], weights, meta.get("tree", {}), meta.get("training", {}))


def validate_meta(meta: Any, where: Path) -> dict[str, Any]:
    """Check a drafter.json before use: format and version, `kind` (a string), `target` (an object
    with a string `fingerprint`; `source` a string and `vocab_size` / `d_model` / `n_layer` integers
    where present), `config` (an object), and where present `tree` (an object whose `rank_paths` is a
    list of non-empty lists of non-negative integers) and `training` (an object). One-line
    `CheckpointError` naming the first bad field."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION \
            or isinstance(meta.get("version"), bool):
        found = meta if not isinstance(meta, dict) else f"{meta.get('format')!r} version {meta.get('version')!r}"
        raise CheckpointError(f"{where}: expected format {FORMAT!r} version {VERSION}, got {str(found)[:80]}")

    def field(parent: dict[str, Any], key: str, name: str, kind: type, what: str, required: bool = True) -> Any:
        if key not in parent:
            if required:
                raise CheckpointError(f"{where}: field {name} is missing")
            return None
        value = parent[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CheckpointError(f"{where}: field {name} must be {what}, got {repr(value)[:60]}")
        return value

    field(meta, "kind", "kind", str, "a string")
    target = field(meta, "target", "target", dict, "an object")
    field(target, "fingerprint", "target.fingerprint", str, "a string")
    field(target, "source", "target.source", str, "a string", required=False)
    for key in ("vocab_size", "d_model", "n_layer"):
        field(target, key, f"target.{key}", int, "an integer", required=False)
    field(meta, "config", "config", dict, "an object")
    field(meta, "training", "training", dict, "an object", required=False)
    tree = field(meta, "tree", "tree", dict, "an object", required=False) or {}
    paths = field(tree, "rank_paths", "tree.rank_paths", list, "a list of rank paths", required=False) or []
    if not all(isinstance(p, list) and p and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in p)
               for p in paths):
        raise CheckpointError(f"{where}: field tree.rank_paths must be a list of non-empty lists of non-negative "
                              f"integers, got {repr(paths)[:60]}")
    return meta
