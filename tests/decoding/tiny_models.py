"""Tiny random models and the distribution distance shared by the decoding tests."""

import torch

from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer

DRAFTER_OPTIONS = {"draft_model": {"layers": 1, "num_tokens": 3}, "layer_skip": {"num_skip": 1, "window": 4}}
"""Options the drafters need on the tiny targets (the retrieval corpus comes from the `drafter_options` fixture)."""


def random_model(*, seed: int, std: float, **config) -> Transformer:
    """A `Transformer(ModelConfig(**config))` with seeded random weights (larger std: peakier outputs)."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**config))
    model.init_weights(std=std)
    return model.eval()


def greedy_target() -> Transformer:
    """The 64-token model the greedy exactness suites decode with."""
    return random_model(seed=1, std=0.3, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=256)


def tiny_vocab_target() -> Transformer:
    """An 8-token model, peaked enough that sampled drafts get accepted, for distribution tests."""
    return random_model(seed=3, std=0.8, vocab_size=8, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32)


def tv(samples: list[int], probs: torch.Tensor) -> float:
    """Total variation distance between the empirical distribution of `samples` and `probs` (V,)."""
    freq = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double() / len(samples)
    return 0.5 * (freq - probs.double()).abs().sum().item()


def eagle_package(target: Transformer, directory, *, seed: int = 0, std: float = 0.3) -> str:
    """An untrained EAGLE drafter package for `target` (random block weights, a draft vocabulary of
    all but the last eighth of the tokens, a 6-node static tree), saved in `directory`."""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.eagle import EagleNet

    torch.manual_seed(seed)
    vocab = target.config.vocab_size - target.config.vocab_size // 8
    net = EagleNet(target.config, vocab)
    net.init_from_target(target, torch.arange(vocab), std=std)
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    package = DrafterPackage("eagle", DrafterPackage.describe_target(target, "tiny"),
                             {"draft_vocab_size": vocab, "d_ff": target.config.d_ff}, net.trainable_state(), tree)
    return str(package.save(directory))



def oracle_eagle_package(directory) -> tuple[Transformer, str]:
    """A one-block target without attention output (each token's logits depend on that token only)
    and an EAGLE drafter that computes exactly what the target computes: fc passes the token
    embedding (ignoring the feature), the draft block, norm and full-vocabulary head are the
    target's. Every draft token is the target's greedy token, so every draft is accepted. (With
    attention the drafter could not be exact: its context has no pair for the first prompt token.)"""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.eagle import EagleNet

    target = random_model(seed=4, std=0.3, vocab_size=64, n_layer=1, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                          max_seq_len=256)
    with torch.no_grad():
        target.blocks[0].attn.o_proj.weight.zero_()
    net = EagleNet(target.config, 64)
    net.init_from_target(target, torch.arange(64))
    C = target.config.d_model
    with torch.no_grad():
        net.fc.weight.copy_(torch.cat([torch.zeros(C, C), torch.eye(C)], dim=1))
        net.layer.blocks[0].load_state_dict(target.blocks[0].state_dict())
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    package = DrafterPackage("eagle", DrafterPackage.describe_target(target, "oracle"),
                             {"draft_vocab_size": 64, "d_ff": target.config.d_ff}, net.trainable_state(), tree)
    return target, str(package.save(directory))
