"""longpack: packed sequences, THD batches, config checks and layout planning for Megatron-style training."""

__version__ = "0.1.0"
