"""Byzantium: multi-agent LLM protocols under faulty and adversarial agents, on a batched paged-KV engine."""
