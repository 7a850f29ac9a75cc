"""longpack.rules."""
