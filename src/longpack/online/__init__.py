"""longpack.online."""
