"""Variability rules: which operator makes the step time vary (PRISM)."""
