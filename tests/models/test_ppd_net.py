"""PPD prompt tokens: the training layout (every group in one cache-free forward) gives each prompt row
what decoding gives it (the prompts run after the cached context), and a fresh net starts from the
draft vocabulary's mean embedding."""

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.models.cache import KVCache
from warpdecode.models.ppd import PromptTokens, appended_prompt_layout


def test_layout_of_the_docstring_example():
    positions, mask = appended_prompt_layout(3, torch.tensor([[1]]), 2)
    assert positions.tolist() == [[0, 1, 2, 2, 3]]
    assert mask[0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0],
                                      [1, 1, 0, 1, 1]]


@torch.inference_mode()
def test_training_layout_equals_prompts_after_a_cached_context():
    target = greedy_target()
    torch.manual_seed(0)
    K, T = 3, 12
    prompts = torch.randn(K, target.config.d_model)
    tokens = torch.randint(0, 64, (2, T))
    starts = torch.tensor([[2, 7], [10, 0]])
    positions, mask = appended_prompt_layout(T, starts, K)
    x = torch.cat([target.embed(tokens), prompts.repeat(2, 1)[None].expand(2, -1, -1)], dim=1)
    ids = torch.cat([tokens, tokens.new_zeros(2, 2 * K)], dim=1)
    together = target(ids, positions, attention_mask=mask, inputs_embeds=x).logits  # (2, T + 2K, V)
    # the context rows are the plain forward's
    torch.testing.assert_close(together[:, :T], target(tokens).logits)
    for b in range(2):
        for s, t in enumerate(starts[b].tolist()):
            cache = KVCache.for_model(target.config, 1, t + 1 + K)
            target(tokens[b : b + 1, : t + 1], cache=cache)
            alone = target(torch.zeros(1, K, dtype=torch.int64), cache=cache, inputs_embeds=prompts[None]).logits[0]
            torch.testing.assert_close(together[b, T + s * K : T + (s + 1) * K], alone, rtol=1e-4, atol=1e-4)


def test_fresh_prompts_are_the_mean_draft_embedding():
    target = greedy_target()
    net = PromptTokens(target.config.d_model, 8, 2)
    vocab = torch.tensor([1, 3, 5, 7, 9, 11, 13, 15])
    net.init_from_target(target, vocab)
    mean = target.embed.weight[vocab].mean(0)
    torch.testing.assert_close(net.prompts.data, mean.expand(2, -1))
    torch.testing.assert_close(net.head.weight, target.output_embeddings()[vocab])
    assert not net.head.weight.requires_grad and net.prompts.requires_grad
    assert set(net.trainable_state()) == {"prompts", "draft_vocab"}
    with pytest.raises(ValueError, match="num_prompts >= 1"):
        PromptTokens(32, 8, 0)
