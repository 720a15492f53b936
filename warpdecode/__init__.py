"""warpdecode: train, export and run fast LLM decoding."""

__version__ = "0.1.0"
