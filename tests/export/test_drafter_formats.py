"""`warpdecode convert-drafter`: drafters in the layouts transformers, llama.cpp, Medusa and vLLM load.

Each written file is loaded by the peer's own reader where it is installed here (transformers; llama.cpp
through llama-cpp-python in a separate environment) and its greedy tokens compared with warpdecode's;
the Medusa layouts round-trip into packages whose heads compute the same logits.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import distilled_package, eagle_package, heads_package, naive_greedy, save_tiny_model

from warpdecode.errors import CapabilityError, CheckpointError, ConfigError
from warpdecode.export.drafter_formats import check_format, convert_drafter
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.distilled_draft import DistilledDraftNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.medusa import MedusaHeads

LLAMA_CPP_PYTHON = Path(os.environ.get("WARPDECODE_LLAMA_CPP_PYTHON", "/tmp/llamacpp-venv/bin/python"))
SCRIPT = Path(__file__).parents[2] / "scripts" / "llama_cpp_greedy.py"


def _has_llama_cpp() -> bool:
    """Whether LLAMA_CPP_PYTHON is a Python that imports llama_cpp (a half-made environment is none)."""
    if not LLAMA_CPP_PYTHON.is_file():
        return False
    run = subprocess.run([str(LLAMA_CPP_PYTHON), "-c", "import llama_cpp"], capture_output=True, timeout=60, check=False)
    return run.returncode == 0


HAS_LLAMA_CPP = _has_llama_cpp()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A 3-block GQA model (4 query heads, 2 key-value heads: the q/k row permutation matters) and its BPE."""
    directory = save_tiny_model(tmp_path_factory.mktemp("target") / "model", n_layer=3, n_head=4, n_kv_head=2)
    model, tokenizer = load_pretrained(directory)
    return model, tokenizer


@pytest.fixture(scope="module")
def distilled(target, tmp_path_factory):
    return Path(distilled_package(target[0], tmp_path_factory.mktemp("distilled") / "d", init_layers=(0, 2)))


def _convert(source, out, fmt, target, tokenizer_gguf=None):
    model, tokenizer = target
    return convert_drafter(Path(source), Path(out), fmt, model, tokenizer, target_name="tiny",
                           target_directory=Path(out).parent / "target", tokenizer_gguf=tokenizer_gguf)


def test_distilled_hf_directory_is_greedy_identical_in_transformers(target, distilled, tmp_path):
    transformers = pytest.importorskip("transformers")
    model, tokenizer = target
    out = _convert(distilled, tmp_path / "hf", "hf", target)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = tokenizer.encode("for i in range(10):")
    with torch.inference_mode():
        generated = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(ids):].tolist()
        ours, _ = load_pretrained(out)
        assert generated == naive_greedy(ours, ids, 16)
        # on the draft vocabulary the written model scores exactly what the drafter scores
        net = DrafterPackage.load(distilled).load_net(model, DistilledDraftNet)
        tokens = torch.tensor([ids])
        torch.testing.assert_close(hf(tokens).logits[..., net.draft_vocab], net(tokens, model.embed),
                                   atol=1e-5, rtol=1e-5)


def test_distilled_gguf_reads_back_through_warpdecodes_gguf_importer(target, distilled, tmp_path):
    pytest.importorskip("gguf")
    from warpdecode.export.gguf_writer import write_gguf
    from warpdecode.models.importers.gguf import read_gguf
    from warpdecode.models.importers.hf import state_dict_from_hf

    model, tokenizer = target
    hf_model, _ = load_pretrained(_convert(distilled, tmp_path / "hf", "hf", target))
    target_gguf = write_gguf(model, tokenizer, tmp_path / "target.gguf", name="tiny")
    for name, tokenizer_gguf in (("built.gguf", None), ("copied.gguf", target_gguf)):
        path = _convert(distilled, tmp_path / name, "gguf", target, tokenizer_gguf)
        config, weights, read_tokenizer = read_gguf(path)
        assert config.n_layer == 2 and config.kv_head_count == 2
        state = state_dict_from_hf(weights, config)
        expected = hf_model.state_dict()
        assert state.keys() == {k for k in expected if k != "lm_head.weight" or not config.tie_embeddings}
        for key, tensor in state.items():
            assert torch.equal(tensor, expected[key]), key
        text = "Write a story about a cat."
        assert read_tokenizer.encode(text) == tokenizer.encode(text)


@pytest.mark.skipif(not HAS_LLAMA_CPP,
                    reason=f"needs a Python with llama-cpp-python at {LLAMA_CPP_PYTHON} (python -m venv /tmp/llamacpp-venv "
                           "&& /tmp/llamacpp-venv/bin/pip install llama-cpp-python, or set WARPDECODE_LLAMA_CPP_PYTHON)")
def test_distilled_gguf_is_greedy_identical_in_llama_cpp(target, distilled, tmp_path):
    pytest.importorskip("gguf")
    _, tokenizer = target
    path = _convert(distilled, tmp_path / "draft.gguf", "gguf", target)
    ours, _ = load_pretrained(_convert(distilled, tmp_path / "hf", "hf", target))
    ids = tokenizer.encode("for i in range(10):")
    assert _llama_cpp_greedy(path, ids, 16) == naive_greedy(ours, ids, 16)


def _llama_cpp_greedy(path: Path, ids: list[int], n: int) -> list[int]:
    run = subprocess.run([str(LLAMA_CPP_PYTHON), str(SCRIPT), str(path), json.dumps(ids), str(n)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_qwen2_layout_gguf_reads_back_and_runs_in_llama_cpp(target, tmp_path):
    """The qwen2 graph: q/k/v biases, rows in their own order (llama.cpp permutes llama's only)."""
    pytest.importorskip("gguf")
    from tiny_models import random_model

    from warpdecode.export.gguf_writer import write_gguf
    from warpdecode.models.importers.gguf import read_gguf
    from warpdecode.models.importers.hf import state_dict_from_hf

    _, tokenizer = target
    model = random_model(seed=5, std=0.3, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4, n_kv_head=2,
                         d_model=32, d_ff=64, max_seq_len=256, family="qwen2", qkv_bias=True, tie_embeddings=False)
    with torch.no_grad():
        for block in model.blocks:
            for proj in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
                proj.bias.normal_(std=0.3)
    path = write_gguf(model, tokenizer, tmp_path / "qwen2.gguf", name="tiny qwen2")
    config, weights, _ = read_gguf(path)
    state = state_dict_from_hf(weights, config)
    for key, tensor in model.state_dict().items():
        assert torch.equal(state[key], tensor), key
    if HAS_LLAMA_CPP:
        ids = tokenizer.encode("print('hello world')")
        assert _llama_cpp_greedy(path, ids, 12) == naive_greedy(model, ids, 12)


@pytest.mark.parametrize("fmt", ["medusa", "vllm-medusa"])
def test_medusa_layouts_round_trip_to_identical_heads(target, fmt, tmp_path):
    model, _ = target
    num_layers = 1 if fmt == "medusa" else 2
    source = Path(heads_package(model, tmp_path / "package", "medusa", num_heads=3, num_layers=num_layers))
    out = _convert(source, tmp_path / fmt, fmt, target)
    config = json.loads((out / "config.json").read_text())
    C, V = model.config.d_model, model.config.vocab_size
    if fmt == "medusa":  # FasterDecoding/Medusa's names and shapes (medusa/model/medusa_model.py)
        assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (3, 1)
        weights = load_file(str(out / "medusa_lm_head.safetensors"))
        assert weights["2.0.linear.weight"].shape == (C, C) and weights["2.1.weight"].shape == (V, C)
    else:  # vLLM's (vllm/model_executor/models/medusa.py)
        assert (config["num_heads"], config["num_hidden_layers"], config["truncated_vocab_size"]) == (3, 2, V - V // 8)
        weights = load_file(str(out / "model.safetensors"))
        assert weights["blocks.2.layers.1.weight"].shape == (C, C) and weights["lm_heads.0.weight"].shape == (V - V // 8, C)
    back = _convert(out, tmp_path / "back", "warpdecode", target)
    original = DrafterPackage.load(source).load_net(model, MedusaHeads)
    restored = DrafterPackage.load(back, "medusa")
    assert restored.tree["rank_paths"] == DrafterPackage.load(source).tree["rank_paths"]
    restored_net = restored.load_net(model, MedusaHeads)
    features = torch.randn(5, C)
    assert torch.equal(restored_net.draft_vocab, original.draft_vocab)
    torch.testing.assert_close(restored_net(features), original(features), atol=0, rtol=0)


def test_vllm_medusa_over_the_whole_vocabulary_puts_head_rows_in_token_order(target, tmp_path):
    """vLLM reads token_map only when the vocabulary is truncated: a frequency-ranked draft vocabulary of
    every token is written as rows in token-id order, and drafts the same tokens."""
    model, _ = target
    V, C = model.config.vocab_size, model.config.d_model
    package = DrafterPackage.load(heads_package(model, tmp_path / "package", "medusa", num_heads=2))
    net = MedusaHeads(C, V, 2, 1)
    net.load_state_dict({**package.weights, "draft_vocab": torch.randperm(V)}, strict=False)
    package.weights, package.config = net.trainable_state(), {**package.config, "draft_vocab_size": V}
    package.save(tmp_path / "permuted")
    out = _convert(tmp_path / "permuted", tmp_path / "vllm", "vllm-medusa", target)
    assert "token_map" not in load_file(str(out / "model.safetensors"))
    original = DrafterPackage.load(tmp_path / "permuted").load_net(model, MedusaHeads)
    restored = DrafterPackage.load(_convert(out, tmp_path / "back", "warpdecode", target)).load_net(model, MedusaHeads)
    features = torch.randn(5, C)
    assert torch.equal(restored.draft_vocab, torch.arange(V))
    assert torch.equal(original.draft_vocab[original(features).argmax(-1)], restored(features).argmax(-1))


def test_medusa_legacy_checkpoint_reads_through_the_targets_lm_head(target, tmp_path):
    """medusa_model_legacy.py's heads have no LM head of their own (and its checkpoints no token_map)."""
    model, _ = target
    source = Path(heads_package(model, tmp_path / "package", "medusa", num_heads=2))
    out = _convert(source, tmp_path / "m", "medusa", target)
    weights = load_file(str(out / "medusa_lm_head.safetensors"))
    save_file({k: v for k, v in weights.items() if k.endswith(("linear.weight", "linear.bias"))},
              str(out / "medusa_lm_head.safetensors"))
    restored = DrafterPackage.load(_convert(out, tmp_path / "back", "warpdecode", target)).load_net(model, MedusaHeads)
    original = DrafterPackage.load(source).load_net(model, MedusaHeads)
    features = torch.randn(5, model.config.d_model)
    torch.testing.assert_close(restored(features)[..., original.draft_vocab], original(features), atol=1e-5, rtol=1e-5)


def test_medusa_import_refuses_heads_with_their_own_lm_head(target, tmp_path):
    model, _ = target
    source = Path(heads_package(model, tmp_path / "medusa", "medusa", num_heads=2))
    out = _convert(source, tmp_path / "m", "medusa", target)
    weights = load_file(str(out / "medusa_lm_head.safetensors"))
    weights["1.1.weight"] = weights["1.1.weight"] + 0.1
    save_file(weights, str(out / "medusa_lm_head.safetensors"))
    with pytest.raises(CheckpointError, match="head 1's LM head 1.1.weight is not the target's LM head"):
        _convert(out, tmp_path / "back", "warpdecode", target)


def test_layouts_a_peer_would_misread_are_refused_in_one_line(target, tmp_path):
    model, _ = target
    hydra = heads_package(model, tmp_path / "hydra", "hydra")
    medusa2 = heads_package(model, tmp_path / "medusa2", "medusa", num_layers=2)
    eagle = eagle_package(model, tmp_path / "eagle")
    eagle3 = eagle_package(model, tmp_path / "eagle3", feature_layers=(1, 2, 3))
    cases = [(hydra, "medusa", "Hydra's heads also read the drafted tokens' embeddings"),
             (medusa2, "medusa", r"repeats one block module \(\[ResBlock\] \* medusa_num_layers\)"),
             (eagle, "eagle", "no input norm in its first layer, no norm before the LM head.*train with layout: eagle"),
             (eagle3, "eagle", "feeds both \\(2C wide\\) to attention"),
             (eagle, "hf", "--format hf writes distilled drafters"),
             (eagle, "eagle3", "EAGLE-3 layout.*train with layout: eagle3"),
             (eagle3, "eagle3", "EAGLE-3 layout.*train with layout: eagle3")]
    for source, fmt, message in cases:
        with pytest.raises(CapabilityError, match=message) as error:
            _convert(source, tmp_path / "out", fmt, target)
        assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_eagle1_layout_computes_what_a_llama_decoder_layer_computes_and_round_trips(target, tmp_path):
    """The written checkpoint run as vLLM's llama_eagle.py runs it (transformers' LlamaDecoderLayer with an
    identity input norm, fc over cat(embeds, hidden), no norm after) gives warpdecode's predicted features."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from warpdecode.models.eagle import EagleNet

    model, _ = target
    source = eagle_package(model, tmp_path / "package", layout="eagle")
    out = _convert(source, tmp_path / "eagle", "eagle", target)
    config = transformers.LlamaConfig(**json.loads((out / "config.json").read_text()))
    config._attn_implementation = "eager"
    weights = load_file(str(out / "model.safetensors"))
    assert config.num_hidden_layers == 1 and config.bias is False and "fc.bias" not in weights
    assert "layers.0.input_layernorm.weight" not in weights and not any(k.startswith("norm.") for k in weights)
    layer = modeling_llama.LlamaDecoderLayer(config, 0)
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in weights.items() if k.startswith("layers.0.")})
    T, C = 7, model.config.d_model
    tokens, features = torch.randint(0, model.config.vocab_size, (1, T)), torch.randn(1, T, C)
    with torch.inference_mode():
        x = torch.nn.functional.linear(torch.cat([model.embed(tokens), features], -1), weights["fc.weight"])
        positions = torch.arange(T)[None]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        peer = layer(x, attention_mask=mask, position_ids=positions,
                     position_embeddings=modeling_llama.LlamaRotaryEmbedding(config)(x, positions))
        peer = peer[0] if isinstance(peer, tuple) else peer
        net = DrafterPackage.load(source).load_net(model, EagleNet)
        ours, logits = net(features, tokens, model.embed, positions + 1)  # pairs sit one later: RoPE is relative
        torch.testing.assert_close(ours, peer, atol=1e-5, rtol=1e-5)
        back = DrafterPackage.load(_convert(out, tmp_path / "back", "warpdecode", target), "eagle")
        assert back.tree["rank_paths"] == DrafterPackage.load(source).tree["rank_paths"]
        again, again_logits = back.load_net(model, EagleNet)(features, tokens, model.embed, positions + 1)
        torch.testing.assert_close(again, ours, atol=0, rtol=0)
        torch.testing.assert_close(again_logits, logits, atol=0, rtol=0)


def test_published_eagle_checkpoints_of_other_shapes_are_refused_with_what_differs(target, tmp_path):
    C = target[0].config.d_model
    cases = (("fc has a bias", {"fc.weight": torch.zeros(C, 2 * C), "fc.bias": torch.ones(C)}),
             ("layers.0.input_layernorm.weight is not part of EAGLE-1's shape",
              {"fc.weight": torch.zeros(C, 2 * C), "layers.0.input_layernorm.weight": torch.ones(C)}))
    for i, (message, tensors) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        save_file(tensors, str(tmp_path / str(i) / "model.safetensors"))
        with pytest.raises(CapabilityError, match=message):
            _convert(tmp_path / str(i), tmp_path / "back", "warpdecode", target)


def test_format_and_output_name_are_checked_first(tmp_path):
    for fmt, out, message in (("onnx", "x", "--format must be one of"), ("gguf", "x", "name it NAME.gguf"),
                              ("hf", "x.gguf", "writes a directory")):
        with pytest.raises(ConfigError, match=message):
            check_format(fmt, tmp_path / out)


@pytest.fixture(scope="module")
def target4(tmp_path_factory):
    """A 4-block GQA model: EAGLE-3's layout reads three distinct layer inputs in 1..L-1."""
    directory = save_tiny_model(tmp_path_factory.mktemp("target4") / "model", n_layer=4, n_head=4, n_kv_head=2)
    return load_pretrained(directory)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def peer_eagle3(weights: dict, config: dict, aux: list[torch.Tensor], embeds: torch.Tensor):
    """EAGLE-3's draft forward over T causal pairs as SafeAILab/EAGLE (`cnets.py`: `Model.forward`,
    `LlamaDecoderLayeremb`, `LlamaAttention`, `topK_genrate`'s `lm_head(norm(out))`) and vLLM
    (`llama_eagle3.py`) compute it, written out from the checkpoint alone. aux: the target's hidden
    states (T, C) in layer order; embeds: (T, C). Returns the output fed back (T, C) and logits (T, N)."""
    eps, H, Hkv, D = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    w = {k: v.float() for k, v in weights.items()}
    hidden = torch.cat(aux, -1) @ w["fc.weight"].T  # (T, C)
    x = torch.cat([_rms_norm(embeds, w["midlayer.input_layernorm.weight"], eps),
                   _rms_norm(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)  # (T, 2C)
    T = x.shape[0]
    q, k, v = ((x @ w[f"midlayer.self_attn.{p}_proj.weight"].T).view(T, -1, D).transpose(0, 1) for p in "qkv")
    inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, D, 2).float() / D)
    angles = torch.arange(T).float()[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rotate(t):
        return t * cos + torch.cat([-t[..., D // 2 :], t[..., : D // 2]], -1) * sin

    q, k = rotate(q), rotate(k).repeat_interleave(H // Hkv, 0)
    scores = q @ k.transpose(-1, -2) / D**0.5 + torch.full((T, T), float("-inf")).triu(1)
    y = (scores.softmax(-1) @ v.repeat_interleave(H // Hkv, 0)).transpose(0, 1).reshape(T, H * D)
    out = hidden + y @ w["midlayer.self_attn.o_proj.weight"].T
    n = _rms_norm(out, w["midlayer.post_attention_layernorm.weight"], eps)
    mlp = w["midlayer.mlp.down_proj.weight"]
    out = out + (torch.nn.functional.silu(n @ w["midlayer.mlp.gate_proj.weight"].T) * (n @ w["midlayer.mlp.up_proj.weight"].T)) @ mlp.T
    return out, _rms_norm(out, w["norm.weight"], eps) @ w["lm_head.weight"].T


def test_eagle3_layout_computes_what_the_peers_compute_and_reads_back(target4, tmp_path):
    """A drafter of EAGLE-3's shape (its feature layers listed out of order) written in the EAGLE-3
    layout: the peers' computation from the written files alone gives warpdecode's predicted features
    and draft logits; read back, the package keeps the trained head, drafts losslessly, and writes the
    same files again."""
    from warpdecode.decoding.generate import build_method, generate
    from warpdecode.models.eagle import EagleNet

    model, _ = target4
    source = eagle_package(model, tmp_path / "package", layout="eagle3", feature_layers=(3, 1, 2))
    out = _convert(source, tmp_path / "eagle3", "eagle3", target4)
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    net = DrafterPackage.load(source).load_net(model, EagleNet)
    N, V = net.config.vocab_size, model.config.vocab_size
    assert config["draft_vocab_size"] == N and config["vocab_size"] == V
    assert torch.equal(weights["d2t"] + torch.arange(N), net.draft_vocab)
    assert weights["t2d"].dtype == torch.bool and int(weights["t2d"].sum()) == N
    assert bool(weights["t2d"][net.draft_vocab].all())
    T = 7
    tokens = torch.randint(0, V, (1, T))
    with torch.inference_mode():
        hidden = model(tokens, hidden_layers=(1, 2, 3)).hidden_states
        features = net.target_feature(hidden)  # (1, T, C)
        ours, logits = net(features, tokens, model.embed, torch.arange(1, T + 1)[None])  # RoPE is relative
        peer, peer_logits = peer_eagle3(weights, config, [hidden[j][0] for j in (1, 2, 3)], model.embed(tokens)[0])
        torch.testing.assert_close(ours[0], peer, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[0], peer_logits, atol=1e-4, rtol=1e-4)

        back_dir = _convert(out, tmp_path / "back", "warpdecode", target4)
        back = DrafterPackage.load(back_dir, "eagle")
        assert back.config | {"feature_layers": None} == {"draft_vocab_size": N, "d_ff": model.config.d_ff,
                                                           "feature_layers": None, "layout": "eagle3", "stores_head": True}
        assert "layer.lm_head.weight" in back.weights
        again = back.load_net(model, EagleNet)
        again_out, again_logits = again(again.target_feature(hidden), tokens, model.embed, torch.arange(1, T + 1)[None])
        torch.testing.assert_close(again_out, ours, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(again_logits, logits, atol=1e-4, rtol=1e-4)
    rewritten = load_file(str(_convert(back_dir, tmp_path / "again", "eagle3", target4) / "model.safetensors"))
    assert rewritten.keys() == weights.keys() and all(torch.equal(rewritten[k], weights[k]) for k in weights)
    prompt = [5, 9, 14, 3]
    method = build_method("eagle", options={"path": str(back_dir), "tree": "dynamic"})  # EAGLE-3 stores no tree
    out = generate(model, None, prompt, max_new_tokens=12, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(model, prompt, 12)


def test_eagle3_checkpoints_that_do_not_fit_are_refused_in_one_line(target4, tmp_path):
    model, _ = target4
    source = eagle_package(model, tmp_path / "package", layout="eagle3", feature_layers=(1, 2, 3))
    good = _convert(source, tmp_path / "good", "eagle3", target4)
    weights, config = load_file(str(good / "model.safetensors")), json.loads((good / "config.json").read_text())
    N, C = int(weights["d2t"].shape[0]), model.config.d_model
    cases = [
        (CapabilityError, "midlayer.extra.weight is not part of EAGLE-3's", {"midlayer.extra.weight": torch.ones(C)}, {}),
        (CheckpointError, "has no midlayer.hidden_norm.weight", {"midlayer.hidden_norm.weight": None}, {}),
        (CapabilityError, "norm_before_residual", {}, {"norm_before_residual": True}),
        (CapabilityError, "embed_tokens differs", {"embed_tokens.weight": torch.zeros_like(model.embed.weight)}, {}),
        (CheckpointError, "d2t must map", {"d2t": torch.full((N,), 10**6)}, {}),
        (CheckpointError, "three distinct target layers", {}, {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}),
        (CheckpointError, r"fc.weight must be \(32, 96\)", {"fc.weight": torch.zeros(C, 2 * C)}, {}),
        (CapabilityError, "rope_theta", {}, {"rope_theta": 1.0}),
        (CapabilityError, "rope_theta 'abc'", {}, {"rope_theta": "abc"}),
    ]
    for i, (error, message, changed, config_changes) in enumerate(cases):
        case = tmp_path / f"case{i}"
        case.mkdir()
        tensors = {k: v for k, v in ({**weights, **changed}).items() if v is not None}
        save_file(tensors, str(case / "model.safetensors"))
        (case / "config.json").write_text(json.dumps(config | config_changes))
        with pytest.raises(error, match=message) as raised:
            _convert(case, tmp_path / "back", "warpdecode", target4)
        assert "\n" not in str(raised.value)
    assert not (tmp_path / "back").exists()
    layer0 = eagle_package(model, tmp_path / "layer0", layout="eagle3", feature_layers=(0, 1, 2))
    final = eagle_package(model, tmp_path / "final", layout="eagle3", feature_layers=(1, 2, 4))
    for package in (layer0, final):
        with pytest.raises(CapabilityError, match="inputs of target layers 1..3"):
            _convert(package, tmp_path / "out", "eagle3", target4)
