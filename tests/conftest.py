"""Shared test fixtures: every test starts from the same global torch state."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from built_once import built_once
from tiny_models import (
    DRAFTER_OPTIONS,
    clover_package,
    distilled_package,
    eagle_package,
    greedy_target,
    heads_package,
    layer_router_package,
    ppd_package,
    save_diffusion_drafter,
    save_tiny_model,
)

from warpdecode.export.package import export_package
from warpdecode.models.checkpoint import save_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers), each worker computes on one intra-op thread: two
    one-thread workers finish the suite in about half the time of one two-thread process (measured on
    2 cores: the real-model exactness tests 576 s → 284 s), and two-thread workers would fight over the
    cores. A test that wants more threads sets them and restores them."""
    if hasattr(config, "workerinput"):
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _reset_torch_state() -> Iterator[None]:
    """Seed every RNG and restore the default dtype, so no test depends on the ones before it."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    yield
    torch.set_default_dtype(dtype)


@pytest.fixture
def single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread for the test's duration.

    Tiny-model matmuls gain nothing from a second thread, and when other processes share the two
    cores the OpenMP barriers make each call 50-100x slower (measured: 0.6 ms vs 50 ms per forward).
    Use with `pytestmark = pytest.mark.usefixtures("single_thread")`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)



@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def drafter_options(tmp_path_factory):
    """Constructor options that let every registered drafter run on the 64-token tiny targets:
    `DRAFTER_OPTIONS` plus a token-id corpus for the retrieval drafter (random ids and a repeated
    pattern that the suites' repetitive prompts share) and untrained EAGLE (fusing hidden states 1
    and 3, EAGLE-3 style), Medusa, Hydra, Clover, PPD and distilled drafter packages for
    `greedy_target()`."""
    path = tmp_path_factory.mktemp("retrieval") / "corpus.npy"
    rng = np.random.default_rng(0)
    np.save(path, np.concatenate([rng.integers(0, 64, 300), np.tile([5, 6, 7, 8], 6), rng.integers(0, 64, 100)]))
    eagle = eagle_package(greedy_target(), tmp_path_factory.mktemp("eagle") / "drafter", feature_layers=(1, 3))
    heads = {kind: {"path": heads_package(greedy_target(), tmp_path_factory.mktemp(kind) / "drafter", kind)}
             for kind in ("medusa", "hydra")}
    router = layer_router_package(greedy_target(), tmp_path_factory.mktemp("first") / "router", skip=(1,))
    dlm = save_diffusion_drafter(tmp_path_factory.mktemp("diffuspec") / "dlm", greedy_target().config.vocab_size)
    distilled = distilled_package(greedy_target(), tmp_path_factory.mktemp("distilled") / "drafter")
    clover = clover_package(greedy_target(), tmp_path_factory.mktemp("clover") / "drafter")
    ppd = ppd_package(greedy_target(), tmp_path_factory.mktemp("ppd") / "drafter")
    return {**DRAFTER_OPTIONS, "retrieval": {"corpus": str(path)}, "eagle": {"path": eagle}, **heads,
            "first": {"router": router}, "diffuspec": {"model": str(dlm), "num_tokens": 4},
            "distilled": {"path": distilled, "num_tokens": 3}, "clover": {"path": clover},
            "ppd": {"path": ppd}}


@pytest.fixture(scope="session")
def dlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained masked diffusion LM over the verifiable tasks' characters (peaked random weights)."""
    from warpdecode.data.parallel_tasks import ALPHABET
    from warpdecode.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer(ALPHABET)
    torch.manual_seed(2)
    model = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, d_ff=64,
                                    max_seq_len=64, causal=False, mask_token_id=tokenizer.backend.token_to_id("<|mask|>"),
                                    eos_token_ids=[0]))
    model.init_weights(std=0.6)
    directory = tmp_path_factory.mktemp("dlm") / "model"
    save_pretrained(model, tokenizer, directory)
    return directory


# One dynamo export costs ~15 s even for a tiny model: the export and runtime tests share this package.
@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory, drafter_options) -> Path:
    """`greedy_target()` exported with hidden states 1 and 3 (its final one: those its EAGLE fuses), its untrained EAGLE,
    Medusa, Hydra, distilled and Clover drafters, and int8 and int4 graphs; no tokenizer."""
    drafters = [drafter_options[kind]["path"] for kind in ("eagle", "medusa", "hydra", "distilled", "clover")]
    return built_once(tmp_path_factory, "tiny", lambda root: export_package(
        greedy_target(), None, root / "tiny", source="greedy_target", drafters=drafters, generation={"method": "hydra"},
        quantize=("int8", "int4")))
