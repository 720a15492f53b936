"""The drafter networks' typed configurations: the JSON of packages written before they existed reads back
into them and writes out identically, a wrong field is refused naming it, and such an old package loads
and drafts."""

import json

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CheckpointError
from warpdecode.models.acceptance_head import AcceptanceHeadConfig
from warpdecode.models.clover import CloverConfig, CloverNet
from warpdecode.models.distilled_draft import DistilledConfig, DistilledDraftNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.eagle import EagleConfig, EagleNet
from warpdecode.models.judge_head import JudgeHeadConfig
from warpdecode.models.layer_router import LayerRouterConfig
from warpdecode.models.medusa import HeadsConfig, HydraHeads, MedusaHeads
from warpdecode.models.parallel_filter import ParallelFilterConfig
from warpdecode.models.ppd import PPDConfig, PromptTokens

# `drafter.json` configs as the training modules wrote them before the typed configurations (key order kept).
OLD_CONFIGS = [
    (HeadsConfig, {"draft_vocab_size": 56, "num_heads": 4, "num_layers": 1}),
    (HeadsConfig, {"draft_vocab_size": 56, "num_heads": 3, "num_layers": 1,
                   "medusa2": {"lora_rank": 8, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}}),
    (EagleConfig, {"draft_vocab_size": 56, "d_ff": 64, "feature_layers": [1, 3]}),
    (EagleConfig, {"draft_vocab_size": 64, "d_ff": 64}),
    (CloverConfig, {"draft_vocab_size": 56, "d_ff": 64}),
    (DistilledConfig, {"draft_vocab_size": 56, "num_layers": 1, "init_layers": [0]}),
    (PPDConfig, {"draft_vocab_size": 56, "num_prompts": 3}),
    (AcceptanceHeadConfig, {"d_model": 32, "hidden": 256}),
    (JudgeHeadConfig, {"d_model": 32}),
    (LayerRouterConfig, {"n_layer": 3, "d_model": 32, "threshold": 0.5, "max_skip": None}),
    (LayerRouterConfig, {"n_layer": 3, "d_model": 32, "threshold": 0.7, "max_skip": 1}),
    (ParallelFilterConfig, {"block_length": 8, "hidden": 128}),
]


@pytest.mark.parametrize(("config_class", "data"), OLD_CONFIGS)
def test_old_configs_read_back_and_write_out_identically(config_class, data):
    config = config_class.from_dict(data)
    assert json.dumps(config.to_dict()) == json.dumps(data)


def test_typed_fields_are_typed():
    config = EagleConfig.from_dict({"draft_vocab_size": 56, "d_ff": 64, "feature_layers": [1, 3]})
    assert config.feature_layers == (1, 3) and config.hidden_layers(3) == (1, 3)
    assert EagleConfig.from_dict({"draft_vocab_size": 56, "d_ff": 64}).hidden_layers(3) == (3,)
    assert HeadsConfig.from_dict({"draft_vocab_size": 56, "num_heads": 4, "num_layers": 1, "later": 1}).medusa2 is None


@pytest.mark.parametrize(("data", "message"), [
    ({"draft_vocab_size": "56", "num_heads": 4, "num_layers": 1},
     r"^x/drafter.json: field config.draft_vocab_size of the draft heads must be an integer, got '56'$"),
    ({"draft_vocab_size": 56, "num_heads": True, "num_layers": 1},
     r"field config.num_heads of the draft heads must be an integer, got True$"),
    ({"draft_vocab_size": 56, "num_layers": 1}, r"^x/drafter.json: field config.num_heads of the draft heads is missing$"),
    ({"draft_vocab_size": 56, "num_heads": 4, "num_layers": 1, "medusa2": [8]},
     r"field config.medusa2 of the draft heads must be an object or null, got \[8\]$"),
])
def test_a_bad_field_is_refused_on_one_line_naming_it(data, message):
    with pytest.raises(CheckpointError, match=message):
        HeadsConfig.from_dict(data, "x/drafter.json")


def test_a_bad_list_is_refused():
    with pytest.raises(CheckpointError, match=r"config.feature_layers of the EAGLE network must be a list of integers "
                                              r"or null, got \[1, 'a'\]"):
        EagleConfig.from_dict({"draft_vocab_size": 56, "d_ff": 64, "feature_layers": [1, "a"]})


@pytest.mark.parametrize(("net_class", "config"), [
    (MedusaHeads, {"draft_vocab_size": 56, "num_heads": 4, "num_layers": 1}),
    (HydraHeads, {"draft_vocab_size": 56, "num_heads": 2, "num_layers": 2}),
    (EagleNet, {"draft_vocab_size": 56, "d_ff": 48, "feature_layers": [1, 3]}),
    (CloverNet, {"draft_vocab_size": 56, "d_ff": 48}),
    (DistilledDraftNet, {"draft_vocab_size": 56, "num_layers": 2, "init_layers": [0, 2]}),
    (PromptTokens, {"draft_vocab_size": 56, "num_prompts": 3}),
])
def test_every_drafter_network_is_built_from_its_config(net_class, config):
    target = greedy_target().config
    net = net_class.from_package_config(target, config)
    assert net.draft_vocab.numel() == 56 and isinstance(net.config_class.from_dict(config), net.config_class)


OLD_MEDUSA_JSON = """{
  "format": "warpdecode-drafter",
  "version": 1,
  "kind": "medusa",
  "target": {
    "source": "tiny",
    "fingerprint": "%s",
    "vocab_size": 64,
    "d_model": 32,
    "n_layer": 3
  },
  "config": {
    "draft_vocab_size": 56,
    "num_heads": 3,
    "num_layers": 1
  },
  "tree": {
    "rank_paths": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
  },
  "training": {
    "tokens_seen": 4096,
    "optimizer_steps": 8,
    "minutes": 0.1
  }
}
"""


def test_a_package_written_in_the_old_format_loads_and_drafts(tmp_path):
    """A `drafter.json` as warpdecode wrote it before the typed configurations, beside its weights."""
    from safetensors.torch import save_file

    target = greedy_target()
    torch.manual_seed(0)
    net = MedusaHeads(target.config.d_model, 56, 3, 1)
    net.init_from_target(target, torch.arange(56))
    directory = tmp_path / "medusa"
    directory.mkdir()
    (directory / "drafter.json").write_text(OLD_MEDUSA_JSON % target.fingerprint())
    save_file({k: v.contiguous() for k, v in net.trainable_state().items()}, str(directory / "drafter.safetensors"))
    package = DrafterPackage.load(directory)
    loaded = package.load_net(target, registry.get("drafter", "medusa").net_class or MedusaHeads, directory)
    assert isinstance(loaded, MedusaHeads) and loaded.num_heads == 3
    for key, value in net.trainable_state().items():
        assert torch.equal(loaded.state_dict()[key], value)
    plain = generate(target, None, [1, 2, 3], max_new_tokens=10, stop_at_eos=False)
    drafted = generate(target, None, [1, 2, 3], max_new_tokens=10, stop_at_eos=False,
                       method=build_method("medusa", options={"path": str(directory)}))
    assert drafted.token_ids == plain.token_ids
