"""openenv-mcp: an MCP-contract OpenEnv project (arith_mcp) as a vf-sandbox environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROJECT = Path(__file__).with_name("arith_mcp")

SYSTEM = "Solve the task with the tools you are given. Call submit with the final integer answer."


def render(observation: dict[str, Any], context: str) -> list[dict[str, str]]:
    """Reset observation (the task) → chat messages. Tool results reach the model as tool messages."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": observation.get("task", "")}]


def load_environment(max_turns: int = 8, num_train_examples: int = 100, num_eval_examples: int = 50,
                     seed: int = 0, **kwargs: Any):
    from envs.openenv.env import OpenEnvEnv

    return OpenEnvEnv(
        openenv_project=PROJECT,
        num_train_examples=num_train_examples,
        num_eval_examples=num_eval_examples,
        seed=seed,
        prompt_renderer=render,
        max_turns=max_turns,
        **kwargs,
    )


def scripted_policy():
    """A scripted solver for the offline demo and the end-to-end tests (serve it with
    `python -m testmodel.model_server --policy py:openenv_mcp:scripted_policy`):
    multiply, add, then submit, all through the project's MCP tools. A request for the
    model named "wrong" submits an answer off by one (a failing rollout on purpose)."""
    import re

    from testmodel.model_server import Reply, ToolCallSpec

    def policy(req):
        text = " ".join(m.get("content") or "" for m in req.messages if m["role"] == "user")
        a, b, c = map(int, re.search(r"Compute (\d+) \* (\d+) \+ (\d+)", text).groups())
        results = [m.get("content") for m in req.messages if m["role"] == "tool"]
        off = int(req.model == "wrong")
        if not results:
            return Reply(tool_calls=[ToolCallSpec("multiply", {"a": a, "b": b})])
        if len(results) == 1:
            return Reply(tool_calls=[ToolCallSpec("add", {"a": int(results[0]), "b": c})])
        if len(results) == 2:
            return Reply(tool_calls=[ToolCallSpec("submit", {"answer": int(results[1]) + off})])
        return Reply(content="done")

    return policy
