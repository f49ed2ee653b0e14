"""Declarative benchmarking harness for DSpark speculative decoding."""
