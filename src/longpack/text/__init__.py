"""longpack.text."""
