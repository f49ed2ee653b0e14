"""Measurement tools for the in-house engine (not tests): run them as modules, e.g.
`HARNESS_DATA_DIR=../shared/datasets python3 -m benchmarks.concurrency --help`."""
