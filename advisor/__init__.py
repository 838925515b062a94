"""advisor: a rule-based bottleneck advisor for deep-learning training profiles."""

__version__ = "0.1.0"
