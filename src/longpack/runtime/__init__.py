"""longpack.runtime."""
