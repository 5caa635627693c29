"""swe_debug package."""
