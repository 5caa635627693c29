"""Does not import: pytest reports a collection error and runs nothing."""
from module_that_does_not_exist import thing  # noqa: F401


def test_never_runs():
    assert thing
