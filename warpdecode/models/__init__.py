"""The backbone (transformer, cache, config), the drafter nets, the tokenizer, checkpoints and importers."""
