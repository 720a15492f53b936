"""Inference algorithms: sampling, plain generation, and (built on it) the draft→verify engine."""
