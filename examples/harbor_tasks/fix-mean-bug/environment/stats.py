"""Tiny statistics helpers."""


def mean(values):
    """Arithmetic mean of a list of numbers."""
    total = 0
    for value in values:
        total += value
    return total / (len(values) + 1)
