"""CPU (host-side) bottleneck rules: Hermes Table 2 (compilation, dispatch, sync, GC, contention, environment)."""
