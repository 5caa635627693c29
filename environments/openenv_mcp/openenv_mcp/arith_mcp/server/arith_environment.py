"""An MCP environment on openenv-core's `MCPEnvironment` + FastMCP.

Each episode (seeded) asks for a * b + c. Tools: `add`, `multiply` and
`submit`; `submit` ends the episode with reward 1.0 when the answer is
right, 0.0 otherwise. Every other tool call has reward 0.
"""

import random
from typing import Any, Optional
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State

try:
    from ..models import TaskObservation
except ImportError:
    from models import TaskObservation


class ArithEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        mcp = FastMCP("arith")
        env = self

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @mcp.tool
        def submit(answer: int) -> str:
            """Submit the final answer (ends the episode)."""
            env._submitted = answer
            return "correct" if answer == env._target else "wrong"

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._target: Optional[int] = None
        self._submitted: Optional[int] = None

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TaskObservation:
        rng = random.Random(seed)
        a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(100, 999)
        self._target, self._submitted = a * b + c, None
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return TaskObservation(task=f"Compute {a} * {b} + {c}. Use the tools, then submit the result.",
                               done=False, reward=0.0)

    def _score(self, action: Action, obs: Observation) -> Observation:
        self._state.step_count += 1
        obs.reward = 0.0
        if isinstance(action, CallToolAction) and action.tool_name == "submit" and self._submitted is not None:
            obs.reward = 1.0 if self._submitted == self._target else 0.0
            obs.done = True
        return obs

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self._score(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self._score(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unsupported action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state
