"""vesper's benchmarks and report generators: commands that measure, not tests (`vesper bench`).

They live outside the services: no service package imports them (tests/test_layering.py).
"""
