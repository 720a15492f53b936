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


def save_tiny_model(directory, *, n_layer: int = 2, max_seq_len: int = 256, n_head: int = 2,
                    n_kv_head: int | None = None):
    """A seeded random model with a 300-token BPE (trained on a few code and story lines) saved in
    `directory`, as `load_pretrained` reads it; returns `directory`."""
    from warpdecode.models.checkpoint import save_pretrained
    from warpdecode.models.tokenizer import train_bpe

    texts = ["print('hello world')\n", "for i in range(10):\n    pass\n", "Write a story about a cat.\n"] * 20
    tokenizer = train_bpe(texts, vocab_size=300)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
                         d_model=32, d_ff=64,
                         max_seq_len=max_seq_len, eos_token_ids=[tokenizer.eos_token_id])
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights(std=0.3)
    save_pretrained(model, tokenizer, directory)
    return directory


def greedy_target() -> Transformer:
    """The 64-token model the greedy exactness suites decode with."""
    return random_model(seed=1, std=0.3, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                        max_seq_len=256)


def tiny_vocab_target() -> Transformer:
    """An 8-token model, peaked enough that sampled drafts get accepted, for distribution tests."""
    return random_model(seed=3, std=0.8, vocab_size=8, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32)


def naive_greedy(model, ids: list[int], n: int) -> list[int]:
    """Recompute the whole sequence every step: the reference every cached or speculative loop must equal."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq], device=model.embed.weight.device)).logits[0, -1].argmax()))
    return seq[len(ids):]


def pattern_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    """A self-distillation batch of two right-padded sequences (lengths 14 and 10) repeating a short
    pattern, answers after 4 tokens: `tokens`, `answer_mask`, `lengths`."""
    torch.manual_seed(1)
    pattern = torch.randint(0, vocab_size, (5,))
    tokens = torch.zeros(2, 14, dtype=torch.int64)
    tokens[0] = pattern.repeat(3)[:14]
    tokens[1, :10] = pattern.roll(2).repeat(2)
    lengths = torch.tensor([14, 10])
    answer = (torch.arange(14)[None] >= 4) & (torch.arange(14)[None] < lengths[:, None])
    return {"tokens": tokens, "answer_mask": answer, "lengths": lengths}


def tv(samples: list[int], probs: torch.Tensor) -> float:
    """Total variation distance between the empirical distribution of `samples` and `probs` (V,)."""
    freq = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double() / len(samples)
    return 0.5 * (freq - probs.double()).abs().sum().item()


def feature_drafter_package(kind: str, target: Transformer, directory, *, seed: int = 0, std: float = 0.3,
                            **options) -> str:
    """An untrained EAGLE or Clover (`kind`) package for `target` (random weights of `std`, a draft
    vocabulary of all but the last eighth of the tokens, a 6-node static tree, network `options`
    such as EAGLE's `feature_layers`), saved in `directory`."""
    from warpdecode.models.clover import CloverNet
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.eagle import EagleNet

    torch.manual_seed(seed)
    vocab = target.config.vocab_size - target.config.vocab_size // 8
    net = {"eagle": EagleNet, "clover": CloverNet}[kind](target.config, vocab, **options)
    net.init_from_target(target, torch.arange(vocab), std=std)
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    config = {"draft_vocab_size": vocab, "d_ff": target.config.d_ff, **options}
    package = DrafterPackage(kind, DrafterPackage.describe_target(target, "tiny"), config, net.trainable_state(), tree)
    return str(package.save(directory))


def eagle_package(target: Transformer, directory, *, seed: int = 0, std: float = 0.3,
                  feature_layers: tuple[int, ...] | None = None, layout: str | None = None) -> str:
    """An untrained EAGLE drafter package for `target` (`feature_drafter_package`), fusing the target's
    `feature_layers` (EAGLE-3) when given; of EAGLE-1's shape with `layout="eagle"`."""
    options: dict = {} if feature_layers is None else {"feature_layers": list(feature_layers)}
    if layout is not None:
        options["layout"] = layout
    return feature_drafter_package("eagle", target, directory, seed=seed, std=std, **options)


def clover_package(target: Transformer, directory, *, seed: int = 0, std: float = 0.3) -> str:
    """An untrained Clover drafter package for `target` (`feature_drafter_package`)."""
    return feature_drafter_package("clover", target, directory, seed=seed, std=std)


def distilled_package(target: Transformer, directory, *, seed: int = 0, std: float = 0.3,
                      init_layers: tuple[int, ...] = (0,), vocab: int | None = None) -> str:
    """A distilled draft package for `target`: blocks copied from `init_layers` and perturbed with
    noise of `std`, a draft vocabulary of the first `vocab` tokens (default: all but the last eighth),
    a 6-node static tree; saved in `directory`. With every block, the full vocabulary and `std=0` the
    draft computes exactly what the target computes (an oracle)."""
    from warpdecode.models.distilled_draft import DistilledDraftNet
    from warpdecode.models.drafter_package import DrafterPackage

    torch.manual_seed(seed)
    vocab = target.config.vocab_size - target.config.vocab_size // 8 if vocab is None else vocab
    net = DistilledDraftNet(target.config, len(init_layers), vocab)
    net.init_from_target(target, list(init_layers), torch.arange(vocab))
    with torch.no_grad():
        for p in net.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * std)
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    config = {"draft_vocab_size": vocab, "num_layers": len(init_layers), "init_layers": list(init_layers)}
    package = DrafterPackage("distilled", DrafterPackage.describe_target(target, "tiny"), config,
                             net.trainable_state(), tree)
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


def heads_package(target: Transformer, directory, kind: str, *, seed: int = 0, std: float = 0.3,
                  num_heads: int = 4, num_layers: int = 1, training: dict | None = None) -> str:
    """An untrained Medusa or Hydra (`kind`) package for `target`: random head weights, a draft
    vocabulary of all but the last eighth of the tokens, a 6-node static tree; saved in `directory`."""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.medusa import HydraHeads, MedusaHeads

    torch.manual_seed(seed)
    vocab = target.config.vocab_size - target.config.vocab_size // 8
    heads = {"medusa": MedusaHeads, "hydra": HydraHeads}[kind]
    net = heads(target.config.d_model, vocab, num_heads, num_layers)
    net.init_from_target(target, torch.arange(vocab))
    with torch.no_grad():
        for p in net.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * std)
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    config = {"draft_vocab_size": vocab, "num_heads": num_heads, "num_layers": num_layers}
    package = DrafterPackage(kind, DrafterPackage.describe_target(target, "tiny"), config, net.trainable_state(), tree,
                             training or {})
    return str(package.save(directory))


def ppd_package(target: Transformer, directory, *, seed: int = 0, std: float = 0.3, num_prompts: int = 3) -> str:
    """An untrained PPD package for `target`: the mean-embedding prompts plus noise of `std`, a draft
    vocabulary of all but the last eighth of the tokens, a 6-node static tree; saved in `directory`."""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.ppd import PromptTokens

    torch.manual_seed(seed)
    vocab = target.config.vocab_size - target.config.vocab_size // 8
    net = PromptTokens(target.config.d_model, vocab, num_prompts)
    net.init_from_target(target, torch.arange(vocab))
    with torch.no_grad():
        net.prompts.add_(torch.randn_like(net.prompts) * std * float(net.prompts.norm(dim=-1).mean()))
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    config = {"draft_vocab_size": vocab, "num_prompts": num_prompts}
    package = DrafterPackage("ppd", DrafterPackage.describe_target(target, "tiny"), config, net.trainable_state(), tree, {})
    return str(package.save(directory))


def oracle_heads_package(directory, kind: str) -> tuple[Transformer, str]:
    """A target whose greedy token after x is always π(x) = (5x + 3) mod 64, whatever came before (one
    block whose attention and MLP add nothing, one-hot embeddings, an LM head that permutes), and
    heads (`kind` medusa or hydra, 4 of them) that compute the target's future exactly:

    * Medusa head k maps the feature 8·e_x of x_i to 8·e_x + 16·e_{π^k(x)} (W = 2 Π^k in its block,
      outweighing the residual), which the LM head reads as π^{k+1}(x_i) = x_{i+1+k};
    * Hydra head k passes the embedding of x_{i+k}, the last token it reads, through its skip
      projection, which the LM head reads as π(x_{i+k}).

    Every draft is the target's greedy continuation, so every draft is accepted: this checks that the
    drafter reads the feature of the right position and feeds Hydra's heads the right tokens."""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.medusa import HydraHeads, MedusaHeads

    V = 64
    target = random_model(seed=5, std=0.3, vocab_size=V, n_layer=1, n_head=4, n_kv_head=2, d_model=V, d_ff=64,
                          max_seq_len=256, tie_embeddings=False)
    perm = (torch.arange(V) * 5 + 3) % V  # π, without fixed points
    shift = torch.eye(V)[perm].T  # Π: Π e_x = e_{π(x)}
    assert target.lm_head is not None
    with torch.no_grad():
        target.blocks[0].attn.o_proj.weight.zero_()
        target.blocks[0].mlp.down_proj.weight.zero_()
        target.embed.weight.copy_(torch.eye(V))
        target.lm_head.weight.copy_(shift)  # logits after x: Π e_x = e_{π(x)}
    num_layers = {"medusa": 1, "hydra": 2}[kind]
    net = {"medusa": MedusaHeads, "hydra": HydraHeads}[kind](V, V, 4, num_layers)
    net.init_from_target(target, torch.arange(V))
    with torch.no_grad():
        for k, block in enumerate(net.blocks()[::num_layers], start=1):
            if kind == "medusa":
                block.linear.weight.copy_(2 * torch.linalg.matrix_power(shift, k))
            else:
                assert block.skip is not None
                block.skip.weight.zero_()
                block.skip.weight[:, k * V:].copy_(torch.eye(V))
    tree = {"rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]}
    config = {"draft_vocab_size": V, "num_heads": 4, "num_layers": num_layers}
    package = DrafterPackage(kind, DrafterPackage.describe_target(target, "oracle"), config, net.trainable_state(),
                             tree)
    return target, str(package.save(directory))


def acceptance_head_package(target: Transformer, directory, *, bias: float | None = None, seed: int = 0) -> str:
    """An untrained SpecDec++ acceptance head package for `target`: random weights, or, with `bias`,
    a head whose every prediction is sigmoid(bias) (0 weights in the last layer)."""
    from warpdecode.models.acceptance_head import AcceptanceHead
    from warpdecode.models.drafter_package import DrafterPackage

    torch.manual_seed(seed)
    head = AcceptanceHead(target.config.d_model, hidden=16)
    if bias is not None:
        torch.nn.init.zeros_(head.net[-1].weight)
        torch.nn.init.constant_(head.net[-1].bias, bias)
    package = DrafterPackage("acceptance_head", DrafterPackage.describe_target(target, "tiny"),
                             {"d_model": target.config.d_model, "hidden": 16}, head.state_dict())
    return str(package.save(directory))


def judge_package(target: Transformer, directory, *, bias: float | None = None, seed: int = 0) -> str:
    """An untrained Judge-decoding judge package for `target`: random weights, or, with `bias`, a judge
    whose every score is sigmoid(bias) (zero weights)."""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.judge_head import JudgeHead

    torch.manual_seed(seed)
    head = JudgeHead(target.config.d_model)
    if bias is not None:
        torch.nn.init.zeros_(head.linear.weight)
        torch.nn.init.constant_(head.linear.bias, bias)
    package = DrafterPackage("judge", DrafterPackage.describe_target(target, "tiny"),
                             {"d_model": target.config.d_model}, head.state_dict())
    return str(package.save(directory))


def layer_router_package(target: Transformer, directory, *, skip: tuple[int, ...] = (), seed: int | None = None) -> str:
    """A FiRST layer-router package for `target`: zero weights and biases that skip exactly `skip` on
    every prompt, or, with `seed`, random weights whose decisions vary with the prompt."""
    from warpdecode.models.drafter_package import DrafterPackage
    from warpdecode.models.layer_router import LayerRouter

    router = LayerRouter(target.config.n_layer, target.config.d_model)
    with torch.no_grad():
        router.bias.fill_(6.0)
        router.bias[list(skip)] = -6.0
        if seed is not None:
            router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(seed)))
            router.bias.zero_()
    config = {"n_layer": target.config.n_layer, "d_model": target.config.d_model, "threshold": 0.5, "max_skip": None}
    package = DrafterPackage("layer_router", DrafterPackage.describe_target(target, "tiny"), config, router.state_dict())
    return str(package.save(directory))


def id_tokenizer(vocab_size: int):
    """A word-level tokenizer of `vocab_size` tokens `<|endoftext|>`, `t1`, `t2`, ... (ids 0..V-1), for
    models whose tokens are only ever handled as ids."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    from warpdecode.models.tokenizer import END_OF_TEXT, Tokenizer

    vocab = {END_OF_TEXT: 0} | {f"t{i}": i for i in range(1, vocab_size)}
    backend = HFTokenizer(models.WordLevel(vocab, unk_token=END_OF_TEXT))
    backend.add_special_tokens([END_OF_TEXT])
    return Tokenizer(backend, eos_token=END_OF_TEXT)


def save_diffusion_drafter(directory, vocab_size: int, tokenizer=None, *, max_seq_len: int = 256):
    """A random masked diffusion LM drafting for a target of `vocab_size` tokens, made as an AR → diffusion
    adaptation is: a random causal model whose tokenizer (default `id_tokenizer`) gets an added mask
    token, then bidirectional attention. Saved in `directory` for `load_pretrained`; returns it."""
    from warpdecode.models.checkpoint import save_pretrained
    from warpdecode.models.mask_token import add_mask_token
    from warpdecode.models.tokenizer import MASK

    tokenizer = tokenizer or id_tokenizer(vocab_size)
    model = random_model(seed=5, std=0.5, vocab_size=vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32,
                         max_seq_len=max_seq_len, eos_token_ids=[tokenizer.eos_token_id])
    add_mask_token(model, tokenizer, MASK)
    model.config.causal = False
    save_pretrained(model, tokenizer, directory)
    return directory


SHORT_PROMPTS = ["print('hello world')", "Write a story about a cat.", "for i in range(10):", "hello cat",
                 "Write a story about a dog.", "print(i)", "for cat in range(3): print(cat)", "a story"]


def prompt_file(directory) -> str:
    """A prompts .jsonl of the 8 `SHORT_PROMPTS` in `directory` (the training tests' prompt source)."""
    import json
    from pathlib import Path

    path = Path(directory) / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in SHORT_PROMPTS))
    return str(path)


def initialised_drafter(module):
    """A `DrafterModule` set up as `fit` sets it up, with every token equally frequent: its draft
    vocabulary is the first `draft_vocab_size` token ids (stop ids always in)."""
    from warpdecode.modules.drafter import frequent_tokens

    counts = torch.ones(module.target.config.vocab_size)
    module.init_drafter(frequent_tokens(counts, module.hparams["draft_vocab_size"], list(module.target.config.eos_token_ids)))
    return module


JSON_ALPHABET = '{}[]":,.-+ 0123456789abcdefghijklmnopqrstuvwxyz'
JSON_ALPHABET += "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: 62 - len(JSON_ALPHABET)]
"""62 characters enough for JSON, regexes and choices: with its two special tokens, `greedy_target`'s 64."""


def json_char_pair():
    """(greedy_target, a character tokenizer of `JSON_ALPHABET`): a model and tokenizer for grammar tests."""
    from warpdecode.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer(JSON_ALPHABET)
    model = greedy_target()
    assert tokenizer.vocab_size == model.config.vocab_size == 64
    return model, tokenizer

