"""Prime numbers (unfinished)."""


def primes_below(n):
    raise NotImplementedError
