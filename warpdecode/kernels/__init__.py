"""Fast paths beside their pure-PyTorch references: oneDNN-packed linear layers, weight-only
quantised matmuls. Each kernel is tested against its reference; nothing here knows a model."""
