"""SGLang backend: an SGLang server started per (target, drafter, γ, policy) group."""
