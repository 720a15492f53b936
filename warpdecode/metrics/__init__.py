"""torchmetrics metrics for decoding and drafter training."""
