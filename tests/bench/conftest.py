"""A tiny random model directory shared by the bench tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from warpdecode.models.checkpoint import save_pretrained
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import train_bpe
from warpdecode.models.transformer import Transformer

CONTEXT = 256


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = ["print('hello world')\n", "for i in range(10):\n    pass\n", "Write a story about a cat.\n"] * 20
    tokenizer = train_bpe(texts, vocab_size=300)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, d_ff=64, max_seq_len=CONTEXT,
                         eos_token_ids=[tokenizer.eos_token_id])
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights(std=0.3)
    directory = tmp_path_factory.mktemp("tiny-bench")
    save_pretrained(model, tokenizer, directory)
    return directory
