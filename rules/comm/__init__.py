"""Communication rules (Hermes §4.2.2 communication analysis, Table 3; CAUSES.md ``comm.*``)."""
