"""The oracle gate's verdicts as one JSON document, for comparison with Harbor's own
run of the same tasks (`harbor run -a oracle` plus a nop-agent run for "before"):

    {"schema": "vf-harbor-verdicts/1", "run_dir": ..., "tasks": {
        "<task dir name>": {"valid": true, "reason": "pass", "reward_before": 0.0,
                            "reward_after": 1.0, "rewards_after": {"reward": 1.0}, "detail": ""},
        ...},
     "input_errors": [{"name": ..., "message": ...}]}

`valid` is true exactly when reward_after >= 1 and reward_before < 1 (or absent: no
reward file on the untouched task), with the oracle within its timeout; tasks this
stack refuses have reason "unsupported" and reward_* null.

    python -m harbor_tasks.verdicts RUN_DIR [-o verdicts.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SCHEMA = "vf-harbor-verdicts/1"
KEYS = ("valid", "reason", "reward_before", "reward_after", "rewards_before", "rewards_after", "detail")


def verdicts(run_dir: str | Path) -> dict[str, Any]:
    """The JSON document of the gate run in `run_dir` (its results.jsonl and metadata.json)."""
    run_dir = Path(run_dir)
    tasks: dict[str, Any] = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        v = (row.get("info") or {}).get("verdict") or {}
        name = v.get("instance_id") or (row.get("info") or {}).get("instance_id")
        tasks[str(name)] = {k: v.get(k) for k in KEYS}
    meta_path = run_dir / "metadata.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    errors = [{"name": e.get("name"), "message": e.get("message")} for e in meta.get("input_errors") or []]
    return {"schema": SCHEMA, "run_dir": str(run_dir), "tasks": dict(sorted(tasks.items())), "input_errors": errors}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harbor_tasks.verdicts", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the gate run's results directory (OUTPUT_DIR/evals/harbor-tasks--none/<run>)")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    args = p.parse_args(argv)
    text = json.dumps(verdicts(args.run_dir), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
