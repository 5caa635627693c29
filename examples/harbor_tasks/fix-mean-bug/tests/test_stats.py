import sys

import pytest

sys.path.insert(0, "/app")
from stats import mean  # noqa: E402


def test_mean_of_three():
    assert mean([1, 2, 3]) == 2.0


def test_mean_of_one():
    assert mean([7]) == 7.0


def test_mean_of_floats():
    assert mean([0.5, 1.5]) == pytest.approx(1.0)


def test_empty_raises():
    with pytest.raises(ValueError):
        mean([])
