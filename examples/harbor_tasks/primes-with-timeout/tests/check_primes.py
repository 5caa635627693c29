"""Check primes_below against trial division on small n and a known count on a large n."""

import sys
import time

sys.path.insert(0, "/app")
from primes import primes_below  # noqa: E402

limit = int(sys.argv[1])


def is_prime(k):
    return k >= 2 and all(k % d for d in range(2, int(k**0.5) + 1))


for n in (0, 1, 2, 3, 10, 100, 1000):
    expected = [k for k in range(n) if is_prime(k)]
    assert primes_below(n) == expected, f"primes_below({n}) wrong"

start = time.monotonic()
big = primes_below(limit)
elapsed = time.monotonic() - start
assert len(big) == 17984, f"primes_below({limit}) has {len(big)} primes, expected 17984"
assert elapsed < 2.0, f"too slow: {elapsed:.2f}s"
print(f"ok: {len(big)} primes below {limit} in {elapsed:.3f}s")
