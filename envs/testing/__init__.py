"""Test helpers shipped with the package: `model_server` (a local OpenAI- and
Anthropic-compatible HTTP server with scripted, pluggable policies)."""
