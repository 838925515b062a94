"""Robustness tests: a corpus of malformed and hostile profiles, and property-based fuzzing (issue 6)."""
