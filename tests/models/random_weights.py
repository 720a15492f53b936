"""Random weights for parity tests (imported by the test modules beside it)."""

import torch
from torch import nn


def perturb_parameters(model: nn.Module) -> nn.Module:
    """Randomise every parameter (norm gains and biases included) so each one matters to the output."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.15)
    return model
