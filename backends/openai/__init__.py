"""OpenAI-compatible HTTP backends: a streaming client (`client.py`), vLLM/our spec-decode metrics
(`metrics.py`) and the generic `openai` backend (`adapter.py`) for any server at a given base URL."""
