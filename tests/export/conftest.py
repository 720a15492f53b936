"""The exported package shared by the export tests: one dynamo export costs ~15 s even for a tiny model."""

from pathlib import Path

import pytest
from tiny_models import greedy_target

from warpdecode.export.package import export_package


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory, drafter_options) -> Path:
    """`greedy_target()` exported with hidden states 1 and 3 (its final one: those its EAGLE fuses), its untrained EAGLE,
    Medusa, Hydra, distilled and Clover drafters, and int8 and int4 graphs; no tokenizer."""
    drafters = [drafter_options[kind]["path"] for kind in ("eagle", "medusa", "hydra", "distilled", "clover")]
    return export_package(greedy_target(), None, tmp_path_factory.mktemp("pkg") / "tiny", source="greedy_target",
                          drafters=drafters, generation={"method": "hydra"},
                          quantize=("int8", "int4"))
