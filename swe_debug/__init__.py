"""SWE debugging: is each SWE-style instance valid (the gold patch applies, its
FAIL_TO_PASS tests then pass, PASS_TO_PASS keep passing, the suite really
ran)? Instances and loaders (`instances`), log parsers (`parsers`), grading
(`grading`), layered offline images (`images`), the task model
(`taskset`), one debug rollout (`debug`), the batch runner (`runner`), the
`vf-swe-debug` CLI (`cli`), the `SWEDebugEnv` environment (`env`) and an
example taskset built from PyPI releases (`examples`).
"""


def load_environment(**kwargs):
    """`vf-sandbox eval swe-debug` resolves to this package; see `swe_debug.env.load_environment`."""
    from .env import load_environment as _load

    return _load(**kwargs)
