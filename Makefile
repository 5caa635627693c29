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
# Tests marked `serial` (they assert latency or survival under CPU pressure: the hostile
# flood's sibling p50, fork bombs next to a sibling) run afterwards, alone, in one process.
# Both phases always run; the target fails if either does.
TEST_WORKERS ?= 4
PYTEST := VF_REQUIRE_DOCKER=1 VF_REQUIRE_BROWSER=1 VF_REQUIRE_RAY=1 .venv/bin/pytest -q -p no:cacheprovider
test: setup
	@$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m "not k8s and not serial" --junitxml=test-artifacts/junit.xml; \
	  parallel=$$?; \
	  $(PYTEST) -m "serial and not k8s" --junitxml=test-artifacts/junit-serial.xml; \
	  serial=$$?; \
	  echo "make test: parallel phase exit $$parallel, serial phase exit $$serial"; \
	  [ $$parallel -eq 0 ] && [ $$serial -eq 0 ]

bench: setup
	scripts/bench.sh
