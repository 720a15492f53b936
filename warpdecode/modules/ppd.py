"""Train PPD prompt tokens (`models/ppd.py`) through the frozen target, by teacher distillation.

Each batch row gets `starts_per_sequence` random starts t inside its answer (x_{t+1} is an answer
token, so the target has just emitted it, and x_{t+2} exists). One cache-free forward runs the row's
tokens followed by a group of the K prompt rows after every start (`appended_prompt_layout`: the
context never sees a prompt; a group sees the context up to its start). Prompt j of the group at t
scores x_{t+1+j}; its loss is the soft cross-entropy against the target's own distribution of that
token, read from the same forward (the feature of context row t+j through the frozen draft head), as
Medusa's heads are trained (`modules/medusa.py`); depth j is weighted `depth_decay**(j-1)`. Only the
K·C prompt embeddings get gradients; the backward still runs through every layer, so a step costs
about three forwards of the row plus its prompt rows.

Validation draws its starts from a generator seeded by the batch's tokens, so every validation sees
the same starts and the ranks (hence τ and the stored tree) are comparable across epochs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.metrics.drafting import label_ranks
from warpdecode.models.ppd import PPDConfig, PromptTokens, appended_prompt_layout
from warpdecode.modules.drafter import DrafterModule, DrafterTraining


class PPDModule(DrafterModule):
    aliases = ("warpdecode.modules.ppd.PPDDrafter",)  # former class path (old recipes)
    kind = "ppd"
    net: PromptTokens

    def __init__(
        self,
        num_prompts: int = 3,
        starts_per_sequence: int = 64,
        depth_decay: float = 0.8,
        lr: float = 1e-2,
        warmup_steps: int = 20,
        **training: Any,
    ) -> None:
        """
        Args:
            num_prompts: Prompt tokens K: prompt j guesses the token j places after the one the
                target emits.
            starts_per_sequence: Answer positions per batch row that get a group of prompt rows.
            depth_decay: Loss weight of prompt j is depth_decay**(j-1).
            lr: Peak AdamW learning rate (`DrafterTraining.lr`; prompt embeddings take a higher one).
            warmup_steps: Optimizer steps of warmup (`DrafterTraining.warmup_steps`, shorter here).
            **training: `DrafterTraining`'s keywords (target, draft vocabulary, optimizer, tree,
                export_dir).
        """
        if num_prompts < 1 or starts_per_sequence < 1 or not 0 < depth_decay <= 1:
            raise ConfigError(f"need num_prompts >= 1, starts_per_sequence >= 1 and 0 < depth_decay <= 1, got "
                              f"{num_prompts}, {starts_per_sequence}, {depth_decay}")
        super().__init__(DrafterTraining(lr=lr, warmup_steps=warmup_steps, **training))
        vocab = min(self.training_args.draft_vocab_size, self.target.config.vocab_size)
        self.net = PromptTokens(self.target.config.d_model, vocab, num_prompts)
        self.net.tie_head(self.target)

    def init_drafter(self, draft_vocab: Tensor) -> None:
        self.net.init_from_target(self.target, draft_vocab)
        self._initialised = True

    def sample_starts(self, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(B, S) start positions drawn without replacement among each row's answer starts, and (B, S)
        bool: which are real (a row with fewer than S answer starts fills up with unused ones)."""
        tokens, lengths, answer = batch["tokens"], batch["lengths"], batch["answer_mask"]
        B, T = tokens.shape
        t = torch.arange(T - 1, device=tokens.device)
        eligible = answer[:, 1:] & (t[None] + 2 < lengths[:, None])  # (B, T-1): x_{t+1} answered, x_{t+2} exists
        S = min(self.hparams["starts_per_sequence"], T - 1)
        scores = torch.rand(B, T - 1, generator=generator).to(tokens.device).masked_fill(~eligible, -1.0)
        picked = scores.topk(S, dim=1)
        return picked.indices, picked.values >= 0

    def scored(self, starts: Tensor) -> Tensor:
        """(B, S, K) position t + 1 + j of the token prompt j of the group at each start t scores."""
        return starts[:, :, None] + 1 + torch.arange(1, self.net.num_prompts + 1, device=starts.device)

    def prompt_logits(self, batch: dict[str, Tensor], starts: Tensor) -> tuple[Tensor, Tensor]:
        """Prompt logits (B, S, K, N) of the groups after `starts` (B, S), and the target's own
        distribution (B, S, K, N) over the draft vocabulary of the token each one scores."""
        tokens = batch["tokens"]
        B, T = tokens.shape
        S, K, L = starts.shape[1], self.net.num_prompts, self.target.config.n_layer
        positions, mask = appended_prompt_layout(T, starts, K)
        with torch.no_grad():
            context = self.target.embed(tokens)  # (B, T, C)
        prompts = self.net.prompts.to(context.dtype).repeat(S, 1)  # (S*K, C): the groups in turn
        x = torch.cat([context, prompts[None].expand(B, -1, -1)], dim=1)
        ids = torch.cat([tokens, tokens.new_zeros(B, S * K)], dim=1)  # shape only: `x` is the input
        h = self.target(ids, positions, attention_mask=mask, hidden_layers=(L,), logits_slice=slice(0, 0),
                        inputs_embeds=x).hidden_states[L]  # (B, T + S*K, C)
        head = self.net.head
        logits = head(h[:, T:].to(head.weight.dtype)).view(B, S, K, -1)
        with torch.no_grad():
            # Context row t+j predicts x_{t+1+j}, the token prompt j of the group at t scores.
            rows = (self.scored(starts) - 1).clamp_max(T - 1)  # (B, S, K)
            features = h[:, :T].gather(1, rows.view(B, S * K, 1).expand(-1, -1, h.shape[-1]))
            teacher = head(features.to(head.weight.dtype)).float().softmax(-1).view(B, S, K, -1)
        return logits, teacher

    def labelled(self, batch: dict[str, Tensor], starts: Tensor, real: Tensor) -> Tensor:
        """(B, S, K) bool: prompt j of the group at t scores a token of the row (t + 1 + j < length)."""
        return real[:, :, None] & (self.scored(starts) < batch["lengths"][:, None, None])

    def distillation_loss(self, logits: Tensor, teacher: Tensor, valid: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        ce = -(teacher * logits.float().log_softmax(-1)).sum(-1)  # (B, S, K)
        total = torch.zeros((), device=logits.device)
        parts: dict[str, Tensor] = {}
        for j in range(logits.shape[2]):
            weight = valid[:, :, j].float()
            depth_loss = (ce[:, :, j] * weight).sum() / weight.sum().clamp_min(1)
            total = total + self.hparams["depth_decay"] ** j * depth_loss
            parts[f"token_loss/d{j + 1}"] = depth_loss.detach()
        return total, parts

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        starts, real = self.sample_starts(batch)
        logits, teacher = self.prompt_logits(batch, starts)
        return self.distillation_loss(logits, teacher, self.labelled(batch, starts, real))

    def evaluate(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """One forward for both: the loss and the ranks at the same (seeded) starts."""
        generator = torch.Generator().manual_seed(int(batch["tokens"][:, :8].sum()))
        starts, real = self.sample_starts(batch, generator)
        logits, teacher = self.prompt_logits(batch, starts)
        loss, _ = self.distillation_loss(logits, teacher, self.labelled(batch, starts, real))
        return loss, self.ranks_at(batch, logits, starts, real)

    def ranks(self, batch: dict[str, Tensor]) -> Tensor:
        return self.evaluate(batch)[1]

    def ranks_at(self, batch: dict[str, Tensor], logits: Tensor, starts: Tensor, real: Tensor) -> Tensor:
        """(M, K) rank of x_{t+1+j} in prompt j's logits (B, S, K, N), for the M real starts."""
        tokens = batch["tokens"]
        B, S, K, _ = logits.shape
        truth = tokens.gather(1, self.scored(starts).clamp_max(tokens.shape[1] - 1).view(B, S * K)).view(B, S, K)
        labels = torch.where(self.labelled(batch, starts, real), self.draft_labels(truth), -1)
        ranks = label_ranks(logits.flatten(0, 2).float(), labels.flatten(), self.training_args.max_rank)
        return ranks.view(B, S, K)[real]

    def package_config(self) -> PPDConfig:
        return PPDConfig(draft_vocab_size=int(self.net.draft_vocab.numel()), num_prompts=self.net.num_prompts)
