"""Backbone parity: cached, chunked, ragged-batch and tree forwards all equal a plain full forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from random_weights import perturb_parameters
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.importers.hf import config_from_hf, state_dict_from_hf
from warpdecode.models.transformer import Transformer, rope_inv_freq

pytestmark = pytest.mark.usefixtures("single_thread")

ATOL = 1e-5
V = 97
PROMPT_LENS = {1: [5], 3: [5, 2, 7]}  # ragged on purpose: rows start decoding at different slots


def tiny_config(kind: str, **overrides: object) -> ModelConfig:
    """Llama (GQA), Qwen2 (qkv bias, Hkv = 1) or GPT-2 (learned positions, layernorm, gelu) in miniature."""
    base = ModelConfig(
        vocab_size=V, n_layer=2, n_head=4, d_model=32, d_ff=56, max_seq_len=64, tie_embeddings=False
    )
    if kind == "llama":
        config = dataclasses.replace(base, n_kv_head=2)
    elif kind == "qwen2":
        config = dataclasses.replace(base, n_kv_head=1, qkv_bias=True, rope_theta=1e6, family="qwen2")
    else:
        config = dataclasses.replace(
            base,
            d_ff=128,
            norm="layernorm",
            mlp="gelu_tanh",
            position="learned",
            qkv_bias=True,
            out_bias=True,
            mlp_bias=True,
            tie_embeddings=True,
            family="gpt2",
        )
    return dataclasses.replace(config, **overrides)  # type: ignore[arg-type]


def tiny_model(config: ModelConfig, seed: int = 0) -> Transformer:
    """A random model whose every parameter (norm gains and biases included) matters to the output."""
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    return perturb_parameters(model)


def pad_rows(rows: list[Tensor], pad: int = V - 1) -> Tensor:
    """Right-pad 1-D token rows into a (B, max_len) batch."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.int64)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out


def prefill_ragged(model: Transformer, prompts: list[Tensor], max_len: int = 32) -> tuple[KVCache, Tensor]:
    """Prefill right-padded prompts, then roll each row back to its true length."""
    cache = KVCache.for_model(model.config, len(prompts), max_len)
    logits = model(pad_rows(prompts), cache=cache).logits
    cache.truncate([len(p) for p in prompts])
    return cache, logits


def full_logits(model: Transformer, seq: Tensor) -> Tensor:
    """Cache-free logits (T, V) of one row."""
    return model(seq[None]).logits[0]


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("step", [1, 3])
def test_cached_decoding_matches_full_forward(family: str, B: int, step: int) -> None:
    model = tiny_model(tiny_config(family))
    lens = PROMPT_LENS[B]
    n_new = 6
    seqs = [torch.randint(0, V - 1, (n + n_new,)) for n in lens]
    reference = model(pad_rows(seqs)).logits  # (B, T, V); causal, so right padding is harmless

    cache, prefill = prefill_ragged(model, [s[:n] for s, n in zip(seqs, lens)])
    for b, n in enumerate(lens):
        torch.testing.assert_close(prefill[b, :n], reference[b, :n], atol=ATOL, rtol=0)
    new = torch.stack([s[n:] for s, n in zip(seqs, lens)])  # (B, n_new)
    for j in range(0, n_new, step):
        logits = model(new[:, j : j + step], cache=cache).logits  # (B, step, V)
        for b, n in enumerate(lens):
            torch.testing.assert_close(logits[b], reference[b, n + j : n + j + step], atol=ATOL, rtol=0)
    assert cache.lengths.tolist() == [n + n_new for n in lens]


@torch.no_grad()
@pytest.mark.parametrize("B", [1, 3])
def test_batch_rows_are_independent(B: int) -> None:
    """A ragged batch (uniform steps, then a ragged chunk) gives each row the logits it gets alone."""
    model = tiny_model(tiny_config("llama"))
    lens = PROMPT_LENS[B]
    prompts = [torch.randint(0, V - 1, (n,)) for n in lens]
    new = torch.randint(0, V - 1, (B, 5))
    chunks = [slice(0, 1), slice(1, 2), slice(2, 5)]

    cache, _ = prefill_ragged(model, prompts)
    batched = [model(new[:, c], cache=cache).logits for c in chunks]
    for b, prompt in enumerate(prompts):
        alone = KVCache.for_model(model.config, 1, 32)
        model(prompt[None], cache=alone)
        for c, logits in zip(chunks, batched):
            torch.testing.assert_close(
                logits[b], model(new[b : b + 1, c], cache=alone).logits[0], atol=ATOL, rtol=0
            )


# A 7-node tree, depths 0..3:      0
#                                 / \
#                                1   2
#                               / \   \
#                              3   4   5
#                              |
#                              6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]


def ancestors(node: int) -> list[int]:
    """Root-to-node path, both ends included."""
    path = [node]
    while PARENTS[path[-1]] >= 0:
        path.append(PARENTS[path[-1]])
    return path[::-1]


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("B", [1, 3])
def test_tree_forward_then_commit(family: str, B: int) -> None:
    model = tiny_model(tiny_config(family))
    N = len(PARENTS)
    lens = PROMPT_LENS[B]
    prompts = [torch.randint(0, V - 1, (n,)) for n in lens]
    tree = torch.randint(0, V - 1, (B, N))
    depth = torch.tensor([len(ancestors(n)) - 1 for n in range(N)])
    mask = torch.zeros(N, N, dtype=torch.bool)
    for n in range(N):
        mask[n, ancestors(n)] = True
    assert depth.tolist() == [0, 1, 1, 2, 2, 2, 3]

    cache, _ = prefill_ragged(model, prompts)
    tree_start = cache.lengths.clone()
    positions = tree_start[:, None] + depth  # (B, N)
    logits = model(tree, positions=positions, cache=cache, attention_mask=mask.expand(B, N, N)).logits
    for b, prompt in enumerate(prompts):
        for n in range(N):
            path_alone = full_logits(model, torch.cat([prompt, tree[b, ancestors(n)]]))[-1]
            torch.testing.assert_close(logits[b, n], path_alone, atol=ATOL, rtol=0)

    # Row 0 accepts a full root-to-leaf path, row 1 a shorter leaf path (padded), row 2 a prefix of one.
    path = torch.tensor([[0, 1, 3, 6], [0, 2, 5, 0], [0, 1, 4, 0]])[:B]
    num_accepted = torch.tensor([4, 3, 2])[:B]
    cache.commit(tree_start, path, num_accepted)
    assert cache.lengths.tolist() == (tree_start + num_accepted).tolist()

    follow = torch.randint(0, V - 1, (B, 3))
    steps = [model(follow[:, j : j + 1], cache=cache).logits[:, 0] for j in range(3)]
    for b, prompt in enumerate(prompts):
        accepted = tree[b, path[b, : num_accepted[b]]]
        scratch = full_logits(model, torch.cat([prompt, accepted, follow[b]]))[-3:]
        torch.testing.assert_close(torch.stack([s[b] for s in steps]), scratch, atol=ATOL, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("B", [1, 3])
def test_bidirectional_attends_to_later_tokens(B: int) -> None:
    model = tiny_model(tiny_config("llama", causal=False))
    tokens = torch.randint(0, V - 1, (B, 6))
    logits = model(tokens).logits
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % (V - 1)
    assert float((model(changed).logits[:, 0] - logits[:, 0]).abs().max()) > 1e-3
    all_true = torch.ones(B, 6, 6, dtype=torch.bool)
    torch.testing.assert_close(model(tokens, attention_mask=all_true).logits, logits, atol=1e-6, rtol=0)

    # With a cache: a masked ragged prefill (queries never see pad keys), then one bidirectional block.
    lens = PROMPT_LENS[B]
    prompts = [torch.randint(0, V - 1, (n,)) for n in lens]
    padded = pad_rows(prompts)
    key_valid = torch.arange(padded.shape[1])[None, :] < torch.tensor(lens)[:, None]  # (B, T)
    cache = KVCache.for_model(model.config, B, 32)
    model(padded, cache=cache, attention_mask=key_valid[:, None, :].expand(-1, padded.shape[1], -1))
    cache.truncate(lens)
    block = torch.randint(0, V - 1, (B, 3))
    batched = model(block, cache=cache).logits
    for b, (prompt, n) in enumerate(zip(prompts, lens)):
        # Cache-free reference: the prompt sees only itself, the block sees everything (block-causal).
        rows = torch.arange(n + 3)[:, None]
        block_causal = (torch.arange(n + 3)[None, :] < n) | (rows >= n)  # (T, T)
        alone = model(torch.cat([prompt, block[b]])[None], attention_mask=block_causal[None]).logits[0]
        torch.testing.assert_close(batched[b], alone[-3:], atol=ATOL, rtol=0)


def hf_tiny_llama():  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=56,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.15)
    return hf


@torch.no_grad()
def test_hidden_layers_follow_hf_convention() -> None:
    hf = hf_tiny_llama()
    config = config_from_hf(hf.config.to_dict())
    model = Transformer(config).eval()
    model.load_state_dict(state_dict_from_hf(hf.state_dict(), config))
    L = config.n_layer
    tokens = torch.randint(0, V, (2, 7))
    expected = hf(tokens, output_hidden_states=True).hidden_states
    assert len(expected) == L + 1

    out = model(tokens, hidden_layers=range(L + 1))
    assert sorted(out.hidden_states) == list(range(L + 1))
    for i in range(L + 1):
        torch.testing.assert_close(out.hidden_states[i], expected[i], atol=1e-5, rtol=0)
    assert sorted(model(tokens, hidden_layers=(1, L)).hidden_states) == [1, L]

    # Hidden states of a cached decode step are the matching positions of the full forward.
    cache = KVCache.for_model(config, 2, 16)
    model(tokens[:, :6], cache=cache)
    step = model(tokens[:, 6:], cache=cache, hidden_layers=(0, 2, L), logits_slice=slice(-1, None))
    for i in (0, 2, L):
        torch.testing.assert_close(step.hidden_states[i], expected[i][:, 6:], atol=1e-5, rtol=0)


@torch.no_grad()
def test_errors_name_the_problem() -> None:
    model = tiny_model(tiny_config("llama"))
    cache = KVCache.for_model(model.config, 2, 8)
    model(torch.zeros(2, 6, dtype=torch.int64), cache=cache)
    with pytest.raises(ConfigError, match="KV cache of 8 positions"):
        model(torch.zeros(2, 3, dtype=torch.int64), cache=cache)
    assert cache.lengths.tolist() == [6, 6]  # a refused forward leaves the cache as it was

    with pytest.raises(ValueError, match="cache holds 2 rows"):
        model(torch.zeros(3, 1, dtype=torch.int64), cache=cache)
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        KVCache.for_model(model.config, 1, model.config.max_seq_len + 1)
    with pytest.raises(ValueError, match=r"hidden_layers \[-1, 3\] out of range 0..2"):
        model(torch.zeros(1, 2, dtype=torch.int64), hidden_layers=(3, -1))


@torch.no_grad()
@pytest.mark.parametrize(
    "mask",
    [
        torch.ones(2, 4, 5, dtype=torch.bool),  # wrong T
        torch.ones(3, 4, 4, dtype=torch.bool),  # wrong B
        torch.ones(2, 4, 4, 4, dtype=torch.bool),  # per-head masks are not supported
        # (T, T) with T == H: broadcast against the head dimension, it used to run, silently wrong.
        torch.ones(4, 4, dtype=torch.bool).tril(),
        # float 0/1 masks used to be added to the attention scores.
        torch.ones(2, 4, 4).tril(),
    ],
    ids=["T", "B", "heads", "2d", "float"],
)
@pytest.mark.parametrize("cached", [False, True])
def test_bad_mask_raises(mask: Tensor, cached: bool) -> None:
    model = tiny_model(tiny_config("llama"))
    assert model.config.n_head == 4
    cache = KVCache.for_model(model.config, 2, 8) if cached else None
    with pytest.raises(ValueError, match=r"attention_mask must be"):
        model(torch.zeros(2, 4, dtype=torch.int64), cache=cache, attention_mask=mask)
    assert cache is None or cache.lengths.tolist() == [0, 0]


@torch.no_grad()
@pytest.mark.parametrize("cached", [False, True])
def test_one_mask_shared_by_all_rows(cached: bool) -> None:
    """A (1, T, T) or (1, 1, T, T) mask applies to every row, exactly like the expanded (B, T, T)."""
    model = tiny_model(tiny_config("llama"))
    tokens = torch.randint(0, V - 1, (3, 5))
    mask = torch.rand(5, 5).lt(0.5).tril() | torch.eye(5, dtype=torch.bool)  # (T, T), diagonal always on

    def run(m: Tensor) -> Tensor:
        cache = KVCache.for_model(model.config, 3, 8) if cached else None
        return model(tokens, cache=cache, attention_mask=m).logits

    expected = run(mask.expand(3, 5, 5))
    torch.testing.assert_close(run(mask[None]), expected, atol=0, rtol=0)
    torch.testing.assert_close(run(mask[None, None]), expected, atol=0, rtol=0)
    assert float((expected - run(torch.ones(3, 5, 5, dtype=torch.bool))).abs().max()) > 1e-3


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("norm", "batchnorm", "norm must be one of"),  # used to build a LayerNorm
        ("mlp", "relu", "mlp must be one of"),  # used to build a tanh-GELU MLP
        ("position", "alibi", "position must be one of"),
        ("family", "bert", "family must be one of"),
        ("n_kv_head", 0, "n_kv_head must be positive"),  # used to divide by zero
        ("head_dim", 0, "head_dim must be positive"),  # used to build zero-width heads
        ("n_head", 0, "n_head must be positive"),
    ],
)
def test_config_refuses_unknown_choices(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config("llama", **{field: value})


@pytest.mark.parametrize(
    "scaling",
    [
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        {"rope_type": "linear", "factor": 4.0},
    ],
)
def test_rope_scaling_matches_transformers(scaling: dict[str, object]) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta, head_dim = 500000.0, 64
    hf_config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        rope_theta=theta,
        rope_scaling=dict(scaling),
        max_position_embeddings=131072,
    )
    expected, attention_factor = ROPE_INIT_FUNCTIONS[str(scaling["rope_type"])](hf_config, "cpu")
    config = ModelConfig(
        vocab_size=8,
        n_layer=1,
        n_head=4,
        d_model=4 * head_dim,
        d_ff=8,
        rope_theta=theta,
        rope_scaling=scaling,
    )
    actual = rope_inv_freq(config)
    assert attention_factor == 1.0
    assert actual.shape == (head_dim // 2,)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6)
    default = rope_inv_freq(dataclasses.replace(config, rope_scaling=None))
    if scaling["rope_type"] == "llama3":
        # The three regimes are all present: kept (high freq), divided by the factor, and smoothed.
        assert bool((actual == default).any()) and bool(torch.isclose(actual, default / 8).any())
        assert bool(((actual < default) & ~torch.isclose(actual, default / 8)).any())
    else:
        torch.testing.assert_close(actual, default / 4.0)


def test_learned_position_beyond_context_is_refused():
    config = ModelConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=8, norm="layernorm",
                         mlp="gelu_tanh", position="learned", family="gpt2")
    model = Transformer(config)
    with pytest.raises(ConfigError, match="context of 8 tokens"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_a_half_precision_copy_keeps_its_checkpoints_fingerprint():
    """`to_precision` stamps the float32 weights' fingerprint on the bf16 copy (drafters trained for the
    checkpoint run on it); `.to` alone, or a copy cast back to float32, is fingerprinted from its values."""
    from tiny_models import greedy_target

    original = greedy_target().fingerprint()
    half = greedy_target().to_precision(torch.bfloat16)
    assert half.embed.weight.dtype == torch.bfloat16 and half.fingerprint() == original
    assert greedy_target().to(torch.bfloat16).fingerprint() != original
    assert half.to_precision(torch.float32).fingerprint() != original
