"""Learn2PD's training samples: one-token-per-step trajectories labelled with the final tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle_dlm import EOS, OracleDLM

from warpdecode.datamodules.trajectories import TrajectoryDataModule, record_trajectories
from warpdecode.errors import ConfigError

PROMPT, ANSWER = [5, 6], [9, 10, 11, 12]


def test_labels_say_whether_the_current_prediction_is_already_final() -> None:
    def truth(step: int) -> torch.Tensor:  # position 3 predicts 13 for two steps, then settles on 12
        answer = ANSWER if step >= 2 else ANSWER[:3] + [13]
        return torch.tensor([PROMPT + answer])

    confidence = torch.tensor([[0.99, 0.99, 0.9, 0.8, 0.7, 0.6]])
    model = OracleDLM(truth, confidence)
    c, masked, final = record_trajectories(model, [PROMPT], gen_length=4, block_length=4, eos_token_id=EOS)
    assert c.shape == masked.shape == final.shape == (4, 4)  # one sample per step, the block's 4 positions
    assert torch.allclose(c[0], torch.tensor([0.9, 0.8, 0.7, 0.6]))
    assert masked.tolist() == [[True] * 4, [False, True, True, True], [False, False, True, True],
                               [False, False, False, True]]
    assert final.tolist() == [[True, True, True, False], [True, True, True, False], [True] * 4, [True] * 4]


def test_the_datamodule_decodes_training_prompts_into_train_and_val(dlm_dir: Path) -> None:
    data = TrajectoryDataModule(str(dlm_dir), tasks="copy,add", examples=40, decode_batch_size=8, gen_length=14,
                                block_length=7, batch_size=16)
    data.setup("fit")
    confidence, masked, final = data.data["train"].tensors
    assert confidence.shape[1] == 7 and masked.dtype == torch.bool and final.dtype == torch.bool
    # 14 steps per trajectory (one token each), 4 of the 5 decode batches train, the last one validates
    assert len(data.data["train"]) == 32 * 14 and len(data.data["val"]) == 8 * 14
    assert data.stats["samples"] == 32 * 14 and 0 <= data.stats["final_share"] <= 1
    assert data.target is not None and data.target.config.causal is False


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="multiple of block_length"):
        TrajectoryDataModule("m", gen_length=16, block_length=5)
    with pytest.raises(ConfigError, match="set data.init_args.model"):
        TrajectoryDataModule()
