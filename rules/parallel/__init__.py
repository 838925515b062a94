"""Parallel rules: poor overlap of compute and communication, pipeline bubbles (Hermes §4.2.1)."""
