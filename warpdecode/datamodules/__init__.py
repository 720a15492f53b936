"""LightningDataModules: corpora and other training data turned into cached token batches."""
