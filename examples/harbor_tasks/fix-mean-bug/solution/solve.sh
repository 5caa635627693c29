#!/bin/bash
# Reference solution: rewrite mean() correctly.
set -euo pipefail
cat > /app/stats.py <<'PY'
"""Tiny statistics helpers."""


def mean(values):
    """Arithmetic mean of a list of numbers."""
    if not values:
        raise ValueError("mean() of an empty list")
    return sum(values) / len(values)
PY
