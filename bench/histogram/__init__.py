"""make bench-histogram-core: the agent's native-histogram table (issue 14)."""
