# The two commands of the README: `make demo` (main job) and `make test`.
# Both run the idempotent set-up first.
.PHONY: setup demo test bench
PY := .venv/bin/python

setup:
	scripts/setup.sh

demo: setup
	scripts/demo.sh

test: setup
	VF_REQUIRE_DOCKER=1 VF_REQUIRE_BROWSER=1 VF_REQUIRE_RAY=1 .venv/bin/pytest -q -p no:cacheprovider --junitxml=test-artifacts/junit.xml

bench: setup
	scripts/bench.sh
