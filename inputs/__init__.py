"""What a suite's names point at, resolved to data: task datasets and prompts (`tasks`), model strings to
files and fingerprints (`model_refs`), and the packaged `smollm2-135m` target (`smollm2`).

Below the backends, which load what these resolve, and the harness, which checks a suite against them
before a run; imports only `contracts` (tests/test_import_graph.py).
"""
