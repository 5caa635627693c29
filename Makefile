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

# The suite mostly waits (containers, subprocesses, servers): it runs on parallel workers
# (pytest-xdist), more than the machine's cores. --dist loadgroup keeps each
# @pytest.mark.xdist_group on one worker (tests that share a Ray cluster, a browser, or
# engine state only they may touch); `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 4
test: setup
	VF_REQUIRE_DOCKER=1 VF_REQUIRE_BROWSER=1 VF_REQUIRE_RAY=1 .venv/bin/pytest -q -p no:cacheprovider \
	  -n $(TEST_WORKERS) --dist loadgroup --junitxml=test-artifacts/junit.xml

bench: setup
	scripts/bench.sh
