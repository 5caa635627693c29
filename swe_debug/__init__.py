"""SWE debugging: is each SWE-style instance valid (the gold patch applies, its
FAIL_TO_PASS tests then pass, PASS_TO_PASS keep passing, the suite really
ran)? Instances and loaders (`instances`), log parsers (`parsers`), grading
(`grading`), layered offline images (`images`), the task model
(`taskset`), one debug rollout (`debug`), the `SWEDebugEnv` environment
(`env`), the `vf-swe-debug` CLI (`cli`: an eval of SWEDebugEnv through the
eval runner) and an example taskset built from PyPI releases (`examples`).
"""


def load_environment(**kwargs):
    """`vf-sandbox eval swe-debug` resolves to this package; see `swe_debug.env.load_environment`."""
    from .env import load_environment as _load

    return _load(**kwargs)


_LAZY = {
    "SWEDebugEnv": "swe_debug.env",
    "SandboxTaskSet": "swe_debug.taskset",
    "SWETaskSet": "swe_debug.taskset",
    "SWEInstance": "swe_debug.instances",
}


def __getattr__(name: str):
    """`from swe_debug import SWEDebugEnv` etc. without importing the env stack up front."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swe_debug' has no attribute {name!r}")
