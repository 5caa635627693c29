#!/usr/bin/env bash
# The main job, end to end on this machine (after scripts/setup.sh):
#  1. one sandbox: create, exec, files, limits, delete
#  2. the local scripted model server, then `vf-sandbox eval` on the example
#     environments (single-turn, tool, bash-in-sandbox, Python REPL, OpenEnv, v1 harness)
#  3. `vf-swe-debug --debug-step gold_patch` on the example SWE taskset built
#     from real PyPI releases
# Outputs land in outputs/; `vf-sandbox runs list` and `vf-sandbox dashboard`
# show them.
set -euo pipefail
cd "$(dirname "$0")/.."
VF=.venv/bin/vf-sandbox
PORT=${VF_DEMO_PORT:-8765}
step() { printf '\n\033[1;32m== %s ==\033[0m\n' "$*"; }

$VF sandboxes reap >/dev/null

step "1. one sandbox end to end"
.venv/bin/python scripts/demo_sandbox.py

step "2. evals against local scripted model servers"
# An offline stand-in for a hosted model: the same HTTP APIs, scripted answers.
# Port $PORT is the `local` alias of configs/endpoints.toml; the sandbox envs get
# servers playing their own scripted solvers.
export VF_LOCAL_API_KEY=local
SERVERS=()
trap 'kill "${SERVERS[@]}" 2>/dev/null || true' EXIT
serve() {  # serve PORT POLICY
  .venv/bin/python -m testmodel.model_server --port "$1" --policy "$2" >"/tmp/vf-demo-model-$1.log" 2>&1 &
  SERVERS+=($!)
  for _ in $(seq 1 100); do
    .venv/bin/python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/health', timeout=1)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "model server on port $1 did not start" >&2; return 1
}
serve "$PORT" auto
serve $((PORT + 1)) py:python_math:scripted_policy
serve $((PORT + 2)) py:bash_files:scripted_policy
serve $((PORT + 3)) py:openenv_mcp:scripted_policy
serve $((PORT + 4)) py:v1_sandbox_agent:scripted_policy
EVAL=($VF eval -d -s -k VF_LOCAL_API_KEY)
$VF eval configs/eval/local-demo.toml -d -s                            # single-turn + tool env
"${EVAL[@]}" python-math -m local-model -b "http://127.0.0.1:$((PORT + 1))/v1" -n 4 -r 2   # PythonEnv in Docker
"${EVAL[@]}" bash-files -m local-model -b "http://127.0.0.1:$((PORT + 2))/v1" -n 4 -r 2    # SandboxEnv in Docker
"${EVAL[@]}" openenv-echo -m local -n 2 -r 1                                                # OpenEnv gym project
"${EVAL[@]}" openenv-mcp -m local-model -b "http://127.0.0.1:$((PORT + 3))/v1" -n 2 -r 1   # OpenEnv MCP project
"${EVAL[@]}" v1-sandbox-agent -m local-model -b "http://127.0.0.1:$((PORT + 4))/v1" -n 3 -r 1 \
  -a '{"config": {"taskset": {"num_tasks": 3}, "harness": {"max_turns": 4}}}'               # v1 Taskset + Harness, agent program in Docker

step "3. SWE gold-patch verification on the example taskset (real PyPI releases)"
# builds .cache/swe-examples/examples.jsonl and the images, then runs vf-swe-debug
# (gold patch with --check-fails-before, no-op step, a hanging debug script) and
# checks every instance got its expected verdict
.venv/bin/python -m swe_debug.examples check --junit-dir outputs/swe-debug

step "runs recorded"
$VF runs list
