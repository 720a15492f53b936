"""Fixtures shared by the decoding suites."""

import numpy as np
import pytest
from tiny_models import DRAFTER_OPTIONS, eagle_package, greedy_target, heads_package


@pytest.fixture(scope="session")
def drafter_options(tmp_path_factory):
    """Constructor options that let every registered drafter run on the 64-token tiny targets:
    `DRAFTER_OPTIONS` plus a token-id corpus for the retrieval drafter (random ids and a repeated
    pattern that the suites' repetitive prompts share) and untrained EAGLE, Medusa and Hydra drafter
    packages for `greedy_target()`."""
    path = tmp_path_factory.mktemp("retrieval") / "corpus.npy"
    rng = np.random.default_rng(0)
    np.save(path, np.concatenate([rng.integers(0, 64, 300), np.tile([5, 6, 7, 8], 6), rng.integers(0, 64, 100)]))
    eagle = eagle_package(greedy_target(), tmp_path_factory.mktemp("eagle") / "drafter")
    heads = {kind: {"path": heads_package(greedy_target(), tmp_path_factory.mktemp(kind) / "drafter", kind)}
             for kind in ("medusa", "hydra")}
    return {**DRAFTER_OPTIONS, "retrieval": {"corpus": str(path)}, "eagle": {"path": eagle}, **heads}
