"""vLLM backend: an OpenAI-compatible vLLM server started per (target, drafter, γ, policy) group."""
