"""LightningModules, one per learned component family, and the LightningCLI that runs them."""
