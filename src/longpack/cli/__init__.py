"""Command-line interface (thin: parse arguments, call library code, print)."""
