# The two commands of the README: `make demo` (main job) and `make test`.
# Both run the idempotent set-up first.
.PHONY: setup demo test bench
PY := .venv/bin/python
# uv trusts the system CA store (as scripts/setup.sh does), also for the uv the
# suite and `vf-sandbox env install` run after set-up, whatever the caller's env
export UV_NATIVE_TLS ?= 1

setup:
	scripts/setup.sh

demo: setup
	scripts/demo.sh

test: setup
	VF_REQUIRE_DOCKER=1 VF_REQUIRE_BROWSER=1 VF_REQUIRE_RAY=1 .venv/bin/pytest -q -p no:cacheprovider --junitxml=test-artifacts/junit.xml

bench: setup
	scripts/bench.sh
