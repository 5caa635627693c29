#!/bin/bash
# Reference solution: a sieve of Eratosthenes.
set -euo pipefail
cat > /app/primes.py <<'PY'
"""Prime numbers."""


def primes_below(n):
    if n < 3:
        return []
    sieve = bytearray([1]) * n
    sieve[0] = sieve[1] = 0
    for p in range(2, int(n**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, n, p)))
    return [k for k in range(n) if sieve[k]]
PY
