"""AR → diffusion adaptation end to end on a tiny model: the target's own answers → a masked diffusion LM
with an added mask token → DiffuSpec drafts for the target, greedy-identical, and is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch import Trainer, seed_everything
from tiny_models import SHORT_PROMPTS, prompt_file, save_tiny_model

from warpdecode.datamodules.self_distill import Example
from warpdecode.datamodules.self_distill_answers import AnswerRegions, SelfDistillAnswersDataModule
from warpdecode.decoding.generate import build_method, generate
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.tokenizer import MASK
from warpdecode.modules.masked_diffusion import MaskedDiffusionModule

pytestmark = pytest.mark.usefixtures("single_thread")


def test_answer_regions_pad_with_end_of_text_inside_the_answer() -> None:
    import numpy as np

    batch = AnswerRegions(0)([Example(np.array([5, 6, 7, 8]), 2, None), Example(np.array([5, 6, 7, 8, 9, 10]), 3, None)])
    assert batch["tokens"].tolist() == [[5, 6, 7, 8, 0, 0], [5, 6, 7, 8, 9, 10]]
    assert batch["prompt_lengths"].tolist() == [2, 3] and batch["lengths"].tolist() == [6, 6]


def test_draft_regions_cut_each_answer_and_keep_the_next_tokens() -> None:
    import numpy as np

    examples = [Example(np.array([5, 6, 7, 8, 9]), 2, None), Example(np.array([5, 6, 7, 8, 9, 10, 11]), 3, None)]
    collate = AnswerRegions(0, draft_region=2, fixed_cuts=True)
    batch = collate(examples)
    assert batch["tokens"].tolist() == collate(examples)["tokens"].tolist()  # fixed cuts: the same every time
    for row, e in enumerate(examples):
        cut, end = int(batch["prompt_lengths"][row]), int(batch["lengths"][row])
        assert e.prompt_length <= cut < len(e.tokens) and end == cut + 2
        expected = list(e.tokens[:end]) + [0] * (end - len(e.tokens))  # end-of-text after a finished answer
        assert batch["tokens"][row, :end].tolist() == expected
    cuts = {int(AnswerRegions(0, draft_region=2)(examples)["prompt_lengths"][1]) for _ in range(50)}
    assert cuts == {3, 4, 5, 6}  # training cuts anywhere in the answer


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("ar-target"))


def test_adapting_an_autoregressive_model_gives_a_drafter_it_accepts(target: Path, tmp_path: Path) -> None:
    prompts = prompt_file(tmp_path)
    data = SelfDistillAnswersDataModule(str(target), prompts=[prompts], max_prompts=8, max_new_tokens=12,
                                        features=False, batch_size=4, val_fraction=0.25, cache_dir=str(tmp_path / "c"),
                                        draft_region=4)
    module = MaskedDiffusionModule(pretrained=str(target), lr=3e-3, warmup_steps=5, export_dir=str(tmp_path / "dlm"),
                               eval_decode_batches=1, stratified_t=True)
    seed_everything(0)
    ar_model, ar_tokenizer = load_pretrained(target)
    assert ar_tokenizer.backend.token_to_id(MASK) is None  # the adaptation adds it
    trainer = Trainer(max_steps=80, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, check_val_every_n_epoch=100)
    trainer.fit(module, data)
    dlm, tokenizer = load_pretrained(tmp_path / "dlm")
    assert dlm.config.causal is False and dlm.config.vocab_size == ar_model.config.vocab_size + 1
    assert dlm.config.mask_token_id == tokenizer.backend.token_to_id(MASK) == ar_model.config.vocab_size
    assert dlm.embed.weight.shape[0] == ar_model.config.vocab_size + 1
    method = build_method("diffuspec", options={"model": str(tmp_path / "dlm"), "num_tokens": 4, "steps": 2})
    taus = []
    for prompt in SHORT_PROMPTS:
        plain = generate(ar_model, ar_tokenizer, prompt, max_new_tokens=12, stop_at_eos=False, chat=False)
        out = generate(ar_model, ar_tokenizer, prompt, max_new_tokens=12, stop_at_eos=False, chat=False, method=method)
        assert out.token_ids == plain.token_ids
        taus.append(out.stats.tau)
    # it learned the target's answers (measured ≈1.5 mean τ, up to 2.75 on one prompt; random drafts ≈1.0)
    assert sum(taus) / len(taus) > 1.25, taus
