"""Diffusion-LM parallel decoding: the block-wise denoising loop and its commit policies."""
