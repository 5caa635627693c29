"""openenv-echo: the `openenv init` template project (gym contract) as a vf-sandbox environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).with_name("echo_env")

SYSTEM = (
    "You are talking to an echo environment. Each turn, reply with exactly one JSON object "
    '{"message": "<text>"}. The environment echoes the message back; longer messages earn more reward.'
)


def render(observation: dict[str, Any], context: str, reward: float | None = None) -> list[dict[str, str]]:
    """Observation → chat messages (reset: the task; step: the echo and its reward)."""
    if context == "reset":
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Environment: {observation.get('echoed_message', '')}\nSend your first message."},
        ]
    return [{"role": "user", "content": f"Echo: {json.dumps(observation.get('echoed_message', ''))} "
                                        f"(length {observation.get('message_length', 0)}, reward {reward})"}]


def load_environment(max_turns: int = 3, num_train_examples: int = 100, num_eval_examples: int = 50,
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
