"""longpack.packed."""
