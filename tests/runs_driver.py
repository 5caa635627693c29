"""A stand-in for `vf-sandbox eval` used by the run-registry tests: it records
itself with `RunRecorder` exactly as the eval CLI does, writes eval-shaped
results.jsonl / metadata.json one group at a time, and handles SIGTERM by
saving finished groups and recording `stopped`.

usage: runs_driver.py MODE OUT_DIR N_EXAMPLES [ROLLOUTS]
MODE: complete | fail | slow | crash (raises after 1 group) | nosave (completes
without writing results, as an eval without -s)."""

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from runs.registry import RunRecorder

mode, out, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
r = int(sys.argv[4]) if len(sys.argv) > 4 else 3
out.mkdir(parents=True, exist_ok=True)
rec = RunRecorder.start(kind="eval", name="drv-" + mode, env_id="toy-env", model="toy-model",
                        args={"num_examples": n, "rollouts_per_example": r, "mode": mode,
                              "save_results": mode != "nosave", "model": "toy-model",
                              "sampling_args": {"temperature": 0.7}, "env_args": {"level": 2}},
                        output_dir=str(out))
print(rec.id, flush=True)
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
results = out / "results.jsonl"
done = len({json.loads(x)["example_id"] for x in open(results)}) if results.exists() else 0
log = logging.getLogger("driver")


def row(i, j):
    t0 = 1_700_000_000.0 + i
    reward = 1.0 if (i + j) % 3 else 0.0
    err = {"error": "SandboxCreateError", "message": "container died"} if (i, j) == (2, 1) else None
    info = {"type": "SandboxCreateError", "message": "container died", "kind": "infra", "chain": ["SandboxCreateError"],
            "traceback": 'Traceback (most recent call last):\n  File "env.py", line 7, in setup_state\n'
                         '    sb = await backend.create(spec)\nSandboxCreateError: container died\n'} if err else None
    return {
        "example_id": i,
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "completion": [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"c{i}{j}", "type": "function",
                             "function": {"name": "python", "arguments": json.dumps({"code": f"print({i}+{i})"})}}]},
            {"role": "tool", "tool_call_id": f"c{i}{j}", "content": str(2 * i)},
            {"role": "assistant", "content": f"rollout {j}: the answer is {2 * i if reward else 0}"},
        ],
        "answer": str(2 * i),
        "reward": reward,
        "metrics": {"correct": reward, "num_turns": 2.0 + j},
        "timing": {"start_time": t0, "generation": {"start": t0, "end": t0 + 0.5 + 0.1 * j},
                   "scoring": {"start": t0 + 0.6 + 0.1 * j, "end": t0 + 0.7 + 0.1 * j},
                   "model": {"spans": [{"start": t0, "end": t0 + 0.25}, {"start": t0 + 0.3, "end": t0 + 0.42}]},
                   "env": {"spans": [{"start": t0 + 0.25, "end": t0 + 0.3}]}},
        "token_usage": {"input_tokens": 10 + i, "output_tokens": 5 + j},
        "is_completed": True, "is_truncated": False,
        "error": err, "error_info": info,
    }


for i in range(done, n if mode != "nosave" else 0):
    if stop:
        log.warning("SIGTERM: saved %d groups, stopping", i)
        rec.finish("stopped")
        sys.exit(0)
    if mode == "fail" and i == 1:
        try:  # a real exception, logged with its traceback as the eval runner does
            float("boom at example 1")
        except ValueError:
            log.exception("environment raised while scoring example 1")
        rec.finish("failed", error="ValueError: boom at example 1")
        sys.exit(1)
    if mode == "crash" and i == 1:
        with rec:
            raise RuntimeError("crashed mid-run")
    time.sleep(0.05 if mode in ("complete", "fail") else 0.3)
    with open(results, "a") as f:
        for j in range(r):
            f.write(json.dumps(row(i, j)) + "\n")
    tmp = out / "metadata.json.tmp"
    tmp.write_text(json.dumps({"env_id": "toy-env", "model": "toy-model", "num_examples": n,
                               "rollouts_per_example": r, "pass_threshold": 0.5}))
    os.replace(tmp, out / "metadata.json")
    log.info("finished example %d", i)
    rec.progress(completed=i + 1, total=n, errors=0)
rec.finish("completed")
