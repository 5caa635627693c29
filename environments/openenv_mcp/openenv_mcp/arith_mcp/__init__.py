"""Arithmetic with tools: an MCP-contract OpenEnv environment."""
