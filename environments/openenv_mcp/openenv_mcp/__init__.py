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
