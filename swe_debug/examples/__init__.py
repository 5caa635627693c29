"""A small example SWE taskset built from real code nobody here wrote: released
sdists of small pure-Python libraries from PyPI. The older release is the base,
the upstream source diff between the two releases is the gold patch and the
upstream test diff is the test patch. The sdists are fetched at build time into
a gitignored cache; only this builder and the test lists (metadata.json) are
committed.

    python -m swe_debug.examples build   # dataset + images into .cache/swe-examples/
    python -m swe_debug.examples check   # build, run every check, compare with the expected verdicts
"""
