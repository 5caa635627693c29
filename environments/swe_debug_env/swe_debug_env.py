"""swe-debug: validate SWE-style instances with no model call (reward 1 = valid).

    vf-sandbox eval swe-debug -a '{"dataset": "path/to/instances.jsonl", "check_fails_before": true}'

Arguments are those of `swe_debug.env.load_environment` (dataset, instance_ids,
debug_step, debug_command, debug_script(_path), debug_timeout, test_timeout,
timeout_seconds, check_fails_before, run_setup, run_tests, output_tail_chars,
backend). Without `dataset` it runs the example taskset built from PyPI sdists.
"""

from swe_debug.env import SWEDebugEnv, load_environment

__all__ = ["SWEDebugEnv", "load_environment"]
