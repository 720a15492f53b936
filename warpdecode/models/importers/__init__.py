"""Checkpoint layout conversion: Hugging Face safetensors/config.json and GGUF files."""
