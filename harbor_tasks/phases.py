"""The two in-sandbox phases of a Harbor trial, done as Harbor's `OracleAgent` and
`Verifier` do them (harbor/agents/oracle.py, harbor/verifier/verifier.py):

oracle   solution/ uploaded to /solution, `chmod +x /solution/solve.sh`, then
         `(/solution/solve.sh) > /logs/agent/oracle.txt 2>&1` as the agent user,
         env DEBIAN_FRONTEND=noninteractive + `[solution].env`, within
         `[agent].timeout_sec`. A non-zero exit is recorded, not fatal (Harbor
         goes on to the verifier; so do we).
verifier /tests emptied (anything the agent planted there is gone: Harbor only
         overwrites), tests/ uploaded to /tests, stale reward files removed,
         `chmod +x /tests/test.sh`, then `(/tests/test.sh) >
         /logs/verifier/test-stdout.txt 2>&1` as the verifier user with
         `[verifier].env`, within `[verifier].timeout_sec`. The rewards are
         /logs/verifier/reward.json when it exists, else reward.txt, parsed
         exactly as Harbor parses them (`parse_reward_json` / `parse_reward_text`).

What goes wrong with the *task* is a typed outcome (`VerifierOutcome.error`);
only a sandbox failure (InfraError) and a user switch the sandbox cannot make
(UserSwitchUnsupported) raise.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import time
from typing import Literal

from pydantic import BaseModel

from sandboxes import PathError, Sandbox

from .task import HarborTask

LOGS, AGENT_LOGS, VERIFIER_LOGS = "/logs", "/logs/agent", "/logs/verifier"
TESTS, SOLUTION = "/tests", "/solution"
REWARD_TXT, REWARD_JSON = f"{VERIFIER_LOGS}/reward.txt", f"{VERIFIER_LOGS}/reward.json"
TEST_STDOUT, ORACLE_LOG = f"{VERIFIER_LOGS}/test-stdout.txt", f"{AGENT_LOGS}/oracle.txt"
DEFAULT_AGENT_TIMEOUT = 3600.0
"""Seconds for the oracle when the task sets no `[agent].timeout_sec` (Harbor: none)."""
LOG_TAIL = 4000
REWARD_MAX_BYTES = 1 << 20

ErrorKind = Literal["reward_missing", "reward_empty", "reward_unparsable", "verifier_timeout"]


class PhaseResult(BaseModel):
    """One script run (oracle or tests)."""

    exit_code: int | None = None
    timed_out: bool = False
    timeout_s: float = 0.0
    seconds: float = 0.0
    log_tail: str = ""


class VerifierOutcome(BaseModel):
    """The verifier's result: the rewards, or why there are none."""

    rewards: dict[str, float] | None = None
    error: ErrorKind | None = None
    detail: str = ""
    run: PhaseResult = PhaseResult()

    @property
    def reward(self) -> float | None:
        """The `reward` key (Harbor's 1-D convention), None when absent."""
        return None if self.rewards is None else self.rewards.get("reward")

    @property
    def passed(self) -> bool:
        """Full credit: a `reward` of at least 1."""
        r = self.reward
        return r is not None and r >= 1.0


class RewardError(ValueError):
    """A reward file Harbor's verifier would refuse (empty, unparsable, non-finite)."""

    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind = kind


def parse_reward_text(text: str) -> dict[str, float]:
    """reward.txt as Harbor reads it: `float(text)`, finite, as {"reward": value}."""
    if len(text) == 0:
        raise RewardError("reward_empty", f"Reward file is empty at {REWARD_TXT}")
    try:
        value = float(text)
    except (ValueError, TypeError):
        raise RewardError("reward_unparsable", f"Failed to parse rewards from text file {REWARD_TXT}") from None
    if not math.isfinite(value):
        raise RewardError("reward_unparsable", f"Non-finite reward {value!r} in text file {REWARD_TXT}")
    return {"reward": value}


def parse_reward_json(text: str) -> dict[str, float]:
    """reward.json as Harbor reads it: an object of finite numbers (bools count, as there)."""
    if len(text) == 0:
        raise RewardError("reward_empty", f"Reward file is empty at {REWARD_JSON}")
    try:
        rewards = json.loads(text)
    except (ValueError, TypeError):
        raise RewardError("reward_unparsable", f"Failed to parse rewards from JSON file {REWARD_JSON}") from None
    values = rewards.values() if isinstance(rewards, dict) else [rewards]
    for value in values:
        if not isinstance(value, (int, float)):
            raise RewardError("reward_unparsable", f"Non-numeric reward {value!r} in JSON file {REWARD_JSON}")
        if isinstance(value, float) and not math.isfinite(value):
            raise RewardError("reward_unparsable", f"Non-finite reward {value!r} in JSON file {REWARD_JSON}")
    if not isinstance(rewards, dict):  # Harbor's VerifierResult(rewards=...) takes a mapping only
        raise RewardError("reward_unparsable", f"rewards in {REWARD_JSON} are not a JSON object: {rewards!r}")
    return {str(k): float(v) for k, v in rewards.items()}


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(values: dict[str, str], host: dict[str, str] | None = None) -> dict[str, str]:
    """Harbor's `${VAR}` / `${VAR:-default}` templates in task env values, from the host's
    environment; a `${VAR}` the host does not set is a ValueError naming it."""
    host = dict(os.environ if host is None else host)
    out: dict[str, str] = {}
    for key, value in values.items():
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in host:
                return host[name]
            if default is not None:
                return default
            raise ValueError(f"environment variable {name!r} (for {key!r}) is not set on the host")

        out[key] = _TEMPLATE.sub(sub, str(value))
    return out


def _user(task: HarborTask, phase: str) -> str | None:
    """The user a phase runs as when it is not the sandbox's own (the agent's), else None."""
    agent, verifier = task.config.agent.user, task.config.verifier.user
    if phase == "verifier" and verifier != agent:
        return "0" if verifier is None else str(verifier)  # the image default: root in Harbor's images
    return None


async def _tail(sb: Sandbox, path: str) -> str:
    r = await sb.exec(["bash", "-c", f"tail -c {LOG_TAIL} {shlex.quote(path)} 2>/dev/null || true"], timeout=30)
    return r.stdout


async def run_oracle(sb: Sandbox, task: HarborTask) -> PhaseResult:
    """solution/solve.sh as Harbor's OracleAgent runs it (see the module docstring)."""
    if not task.solve_script.is_file():
        raise FileNotFoundError(f"{task.path}: no solution/solve.sh")
    await sb.upload(task.solution_dir, SOLUTION)
    await sb.exec(["chmod", "+x", f"{SOLUTION}/solve.sh"], timeout=30)
    env = {"DEBIAN_FRONTEND": "noninteractive", **resolve_env(task.config.solution.env)}
    timeout = task.config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT
    t0 = time.perf_counter()
    r = await sb.exec(["bash", "-c", f"({SOLUTION}/solve.sh) > {ORACLE_LOG} 2>&1"], env=env,
                      cwd=task.workdir(), timeout=timeout)
    seconds = round(time.perf_counter() - t0, 4)
    return PhaseResult(exit_code=r.exit_code, timed_out=r.timed_out, timeout_s=timeout, seconds=seconds,
                       log_tail=await _tail(sb, ORACLE_LOG))


async def run_verifier(sb: Sandbox, task: HarborTask) -> VerifierOutcome:
    """tests/test.sh and its rewards as Harbor's Verifier does it (module docstring)."""
    await sb.exec(["bash", "-c", f"mkdir -p {TESTS} && find {TESTS} -mindepth 1 -delete"], timeout=60)
    await sb.upload(task.tests_dir, TESTS)
    await sb.exec(["bash", "-c", f"rm -rf -- {REWARD_TXT} {REWARD_JSON}; chmod +x {TESTS}/test.sh"], timeout=30)
    env = resolve_env(task.config.verifier.env)
    timeout = task.config.verifier.timeout_sec
    t0 = time.perf_counter()
    r = await sb.exec(["bash", "-c", f"({TESTS}/test.sh) > {TEST_STDOUT} 2>&1"], env=env or None,
                      cwd=task.workdir(), timeout=timeout, user=_user(task, "verifier"))
    run = PhaseResult(exit_code=r.exit_code, timed_out=r.timed_out, timeout_s=timeout,
                      seconds=round(time.perf_counter() - t0, 4),
                      log_tail=await _tail(sb, TEST_STDOUT))
    if r.timed_out:
        return VerifierOutcome(error="verifier_timeout", run=run,
                               detail=f"tests/test.sh did not finish within the verifier timeout_sec ({timeout:g}s)")
    try:
        if await _exists(sb, REWARD_JSON):
            rewards = parse_reward_json(await _read(sb, REWARD_JSON))
        elif await _exists(sb, REWARD_TXT):
            rewards = parse_reward_text(await _read(sb, REWARD_TXT))
        else:
            return VerifierOutcome(error="reward_missing", run=run,
                                   detail=f"No reward file found at {REWARD_TXT} or {REWARD_JSON}")
    except RewardError as exc:
        return VerifierOutcome(error=exc.kind, detail=str(exc), run=run)
    return VerifierOutcome(rewards=rewards, run=run)


async def _exists(sb: Sandbox, path: str) -> bool:
    r = await sb.exec(["test", "-e", path], timeout=30)
    return r.exit_code == 0


async def _read(sb: Sandbox, path: str) -> str:
    """The file's text ("" when empty: the agent's read_file refuses empty files)."""
    try:
        data = await sb.read_file(path, max_bytes=REWARD_MAX_BYTES)
    except PathError as exc:
        r = await sb.exec(["test", "-s", path], timeout=30)
        if r.exit_code != 0 and await _exists(sb, path):
            return ""
        raise RewardError("reward_unparsable", f"cannot read {path}: {exc}") from exc
    return data.decode("utf-8", "replace")
