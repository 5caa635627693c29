"""Sample suite for the pytest log parser: parametrised ids with spaces and ' - ', every status."""
import pytest


@pytest.mark.parametrize("text", ["a b", "x - y", "plain", "[nested] ok"])
def test_param(text):
    assert text != "x - y"


@pytest.mark.parametrize("n", [1, 2], ids=["one item", "two - items"])
def test_ids(n):
    print("output of", n)
    assert n == 1


def test_skip():
    pytest.skip("not here")


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_setup_error(broken):
    pass


class TestClass:
    def test_method(self):
        assert True
