"""Serving: OpenAI-compatible server, model registry, staged rollout, gateway, sanitized audit log."""
