"""longpack.planner."""
