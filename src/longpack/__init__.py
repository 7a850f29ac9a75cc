"""longpack: packed sequences, THD batches, config checks and layout planning for Megatron-style training."""

from longpack._version import __version__

__all__ = ["__version__"]
