"""arith_mcp server components."""
