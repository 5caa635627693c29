#!/usr/bin/env bash
# Run every benchmark under benchmarks/ in turn; each prints its own table of
# ratios against a baseline measured in the same run. Pass names to run a
# subset: scripts/bench.sh sandbox eval
set -uo pipefail
cd "$(dirname "$0")/.."
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(sandbox backends sandbox_env eval before_after concurrency openenv openenv_start swe swe_registry swe_published runs workers gvisor hosted v1 fork cell_fork harbor)
status=0
for n in "${names[@]}"; do
  script="benchmarks/bench_${n}.py"
  [ -f "$script" ] || { echo "no benchmark $script" >&2; status=1; continue; }
  printf '\n===== %s =====\n' "$script"
  .venv/bin/python "$script" || status=1
done
exit $status
