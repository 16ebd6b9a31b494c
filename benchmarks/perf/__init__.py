"""`vesper bench perf`: every figure a ratio measured in one run (docs/performance.md)."""
