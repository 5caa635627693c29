"""An asyncio token bucket: at most `rate` acquisitions per second after an
initial `burst`. Used to pace sandbox creations (Kubernetes API server,
Prime's create endpoint). Waiters are served in arrival order."""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    """Token bucket; `await limiter.acquire()` before each creation."""

    def __init__(self, rate: float, burst: int = 1, clock=time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    async def acquire(self) -> float:
        """Take one token, sleeping until one is available; returns the seconds waited."""
        waited = 0.0
        async with self._lock:  # FIFO: the lock hands over in arrival order
            self._refill()
            while self._tokens < 1:
                delay = (1 - self._tokens) / self.rate
                await asyncio.sleep(delay)
                waited += delay
                self._refill()
            self._tokens -= 1
        return waited
