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

The same verdicts from Harbor's own runs of the tasks (`harbor_verdicts`: an oracle
job and a nop-agent job, read from each trial's result.json), and the comparison
(`compare`; exit 1 when a task's verdict differs):

    python -m harbor_tasks.verdicts RUN_DIR --harbor-oracle JOBS/oracle-job --harbor-nop JOBS/nop-job

Harbor's side, per task: `unsupported` when the oracle trial raised because the
environment refused what the task asks (a user switch, a network policy), else
`timeout` (AgentTimeoutError / VerifierTimeoutError), `no_reward` (no, empty or
unparsable reward file), `oracle_failed` (oracle reward below 1), `vacuous` (the
nop trial's reward is at least 1), else `pass`. Tasks only one side ran (a job
Harbor refused as a whole, a task.toml it cannot parse) are listed, not compared.
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


_NO_REWARD = {"RewardFileNotFoundError", "RewardFileEmptyError", "VerifierOutputParseError"}
_TIMEOUT = {"AgentTimeoutError", "VerifierTimeoutError"}
_UNSUPPORTED = {"UserSwitchUnsupported", "UnsupportedError", "TaskUnsupported"}


def _trials(job: str | Path) -> dict[str, dict[str, Any]]:
    """Task directory name -> Harbor's result.json of its trial in `job`."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(job).glob("*/result.json")):
        result = json.loads(path.read_text())
        task_path = ((result.get("config") or {}).get("task") or {}).get("path")
        name = Path(task_path).name if task_path else path.parent.name.split("__")[0]
        out[name] = result
    return out


def _reward(trial: dict[str, Any]) -> float | None:
    rewards = (trial.get("verifier_result") or {}).get("rewards") or {}
    value = rewards.get("reward")
    return None if value is None else float(value)


def harbor_verdicts(oracle_job: str | Path, nop_job: str | Path) -> dict[str, dict[str, Any]]:
    """Per task, the gate's verdict computed from Harbor's own oracle and nop jobs (module docstring)."""
    nops = _trials(nop_job)
    out: dict[str, dict[str, Any]] = {}
    for name, trial in _trials(oracle_job).items():
        exc = (trial.get("exception_info") or {}).get("exception_type")
        after = _reward(trial)
        before = _reward(nops[name]) if name in nops else None
        if exc in _UNSUPPORTED:
            reason = "unsupported"
        elif exc in _TIMEOUT:
            reason = "timeout"
        elif exc in _NO_REWARD or (after is None and exc is None):
            reason = "no_reward"
        elif after is None or after < 1.0:
            reason = "oracle_failed"
        elif before is not None and before >= 1.0:
            reason = "vacuous"
        else:
            reason = "pass" if exc is None else "error"
        out[name] = {"valid": reason == "pass", "reason": reason, "reward_before": before, "reward_after": after,
                     "exception": exc}
    return out


def compare(ours: dict[str, Any], theirs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{"agree": [...], "differ": {task: {"ours", "harbor"}}, "only_ours": [...], "only_harbor": [...]}
    over the tasks both sides ran (`ours` is a `verdicts()` document)."""
    mine = ours["tasks"]
    both = sorted(set(mine) & set(theirs))
    differ = {n: {"ours": mine[n]["reason"], "harbor": theirs[n]["reason"]} for n in both
              if (mine[n]["valid"], mine[n]["reason"]) != (theirs[n]["valid"], theirs[n]["reason"])}
    return {"agree": [n for n in both if n not in differ], "differ": differ,
            "only_ours": sorted(set(mine) - set(theirs)), "only_harbor": sorted(set(theirs) - set(mine))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harbor_tasks.verdicts", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the gate run's results directory (OUTPUT_DIR/evals/harbor-tasks--none/<run>)")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    p.add_argument("--harbor-oracle", help="a Harbor job dir of `harbor run -a oracle` on the same tasks")
    p.add_argument("--harbor-nop", help="a Harbor job dir of `harbor run -a nop` on the same tasks")
    args = p.parse_args(argv)
    doc: dict[str, Any] = verdicts(args.run_dir)
    if bool(args.harbor_oracle) != bool(args.harbor_nop):
        p.error("--harbor-oracle and --harbor-nop go together")
    if args.harbor_oracle:
        theirs = harbor_verdicts(args.harbor_oracle, args.harbor_nop)
        doc = {**doc, "harbor": theirs, "comparison": compare(doc, theirs)}
    text = json.dumps(doc, indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if doc.get("comparison", {}).get("differ") else 0


if __name__ == "__main__":
    raise SystemExit(main())
