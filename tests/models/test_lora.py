import pytest
import torch
from tiny_models import greedy_target

from warpdecode.errors import ConfigError
from warpdecode.models.lora import ATTENTION, MLP, attach_lora, merged


def test_adapters_start_at_the_model_and_merge_into_the_same_function():
    model = greedy_target()
    tokens = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        before = model(tokens).logits
        adapters = attach_lora(model, rank=4, alpha=8.0, targets=ATTENTION + MLP)
        assert len(adapters) == model.config.n_layer * 7
        torch.testing.assert_close(model(tokens).logits, before, rtol=0, atol=0)  # B = 0: exactly the model
        for adapter in adapters.values():
            torch.nn.init.normal_(adapter.B, std=0.2)
        adapted = model(tokens).logits
        assert (adapted - before).abs().max() > 0.1
        folded = merged(model, adapters)
        torch.testing.assert_close(folded(tokens).logits, adapted, rtol=1e-4, atol=1e-4)
    assert folded.fingerprint() != greedy_target().fingerprint()
    assert not folded._forward_hooks and all(not m._forward_hooks for m in folded.modules())


def test_only_the_adapters_get_gradients():
    model = greedy_target().requires_grad_(False)
    adapters = attach_lora(model, rank=2, alpha=2.0, targets=("q_proj", "v_proj"))
    assert sorted(adapters) == sorted(f"blocks/{i}/attn/{n}" for i in range(3) for n in ("q_proj", "v_proj"))
    model(torch.randint(0, 64, (1, 5))).logits.sum().backward()
    assert all(p.grad is not None for p in adapters.parameters())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": 0, "alpha": 1.0}, "rank >= 1"),
    ({"rank": 2, "alpha": 1.0, "targets": ("qkv",)}, "targets must be among"),
])
def test_bad_adapters_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        attach_lora(greedy_target(), **kwargs)
