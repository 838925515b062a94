"""Cluster rules: slow rank, slow link, slow group, step fluctuation (Hermes §4.1.1, LLMPrism §IV-D)."""
