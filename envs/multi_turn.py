"""`MultiTurnEnv` (the model / environment turn loop with stop conditions) and
`SingleTurnEnv` (one model response per rollout)."""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from typing import Any

from pydantic import Field

from .clients.base import Client, ModelAuthError
from .decorators import cleanup, stop
from .errors import OverlongPromptError
from .environment import EnvSettings, Environment
from .rubrics.rubric import Rubric
from .types import Messages, Response, RolloutInput, SamplingArgs, State, TimeSpan, TrajectoryStep, TrajectoryStepTokens


def response_to_message(response: Response) -> dict[str, Any]:
    """The assistant message (OpenAI dict form) of a model response."""
    msg: dict[str, Any] = {"role": "assistant", "content": response.message.content}
    if response.message.tool_calls:
        msg["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
            for tc in response.message.tool_calls
        ]
    if response.message.reasoning_content:
        msg["reasoning_content"] = response.message.reasoning_content
    return msg


def step_tokens(response: Response) -> TrajectoryStepTokens | None:
    """A trajectory step's `tokens` from a response that carries the engine's ids
    (the token client); None otherwise."""
    tokens = response.message.tokens
    if tokens is None:
        return None
    out: TrajectoryStepTokens = {**tokens.model_dump(), "is_truncated": bool(response.message.is_truncated)}
    return out


def concat_messages(parts: list[Messages]) -> Messages:
    if all(isinstance(p, str) for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    out: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, str):
            out.append({"role": "user", "content": p})
        else:
            out.extend(p)
    return out


class MultiTurnMonitorRubric(Rubric):
    """Adds the num_turns metric."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.add_metric(self.num_turns)

    def num_turns(self, state: State) -> float:
        return float(len(state.get("trajectory") or []))


class MultiTurnSettings(EnvSettings):
    max_turns: int = Field(-1, description="Model turns per rollout (-1: no limit).")
    max_total_completion_tokens: int = Field(-1, description="Completion tokens per rollout (-1: no limit).")
    timeout_seconds: float | None = Field(None, gt=0, description="Wall-clock limit of a rollout (None: none).")


class MultiTurnEnv(Environment):
    """Alternates model turns and `env_response` until a stop condition fires."""

    Settings = MultiTurnSettings

    def __init__(self, max_turns: int = -1, timeout_seconds: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_turns = max_turns
        self.timeout_seconds = timeout_seconds
        self.max_total_completion_tokens: int = -1
        self.add_rubric(MultiTurnMonitorRubric())

    def set_max_total_completion_tokens(self, max_total_completion_tokens: int) -> None:
        self.max_total_completion_tokens = max_total_completion_tokens

    def set_max_turns(self, max_turns: int) -> None:
        self.max_turns = max_turns

    def set_timeout_seconds(self, timeout_seconds: float | None) -> None:
        self.timeout_seconds = timeout_seconds

    def apply_settings(self, values: dict[str, Any]) -> None:
        values = dict(values)
        own = {"max_turns": self.set_max_turns, "timeout_seconds": self.set_timeout_seconds,
               "max_total_completion_tokens": self.set_max_total_completion_tokens}
        for key in [k for k in values if k in own]:
            own[key](values.pop(key))
        super().apply_settings(values)

    @abstractmethod
    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        """The environment's reply after a model turn."""

    # ---- built-in stop conditions
    @stop(priority=100)
    async def has_error(self, state: State, **kwargs: Any) -> bool:
        return state.get("error") is not None

    @stop
    async def prompt_too_long(self, state: State) -> bool:
        return bool(state.get("prompt_too_long", False))

    @stop
    async def max_turns_reached(self, state: State) -> bool:
        return self.max_turns > 0 and len(state["trajectory"]) >= self.max_turns

    @stop
    async def timeout_reached(self, state: State) -> bool:
        if not self.timeout_seconds:
            return False
        return time.time() - state["timing"].start_time >= self.timeout_seconds

    @stop
    async def max_total_completion_tokens_reached(self, state: State) -> bool:
        if self.max_total_completion_tokens <= 0:
            return False
        return (state.get("usage") or {}).get("output_tokens", 0) >= self.max_total_completion_tokens

    @stop
    async def has_final_env_response(self, state: State) -> bool:
        return state.get("final_env_response") is not None

    # ---- hooks
    async def setup_state(self, state: State) -> State | None:
        """Per-rollout initialisation (mutate `state`)."""
        return state

    async def get_prompt_messages(self, state: State) -> Messages:
        if not state["trajectory"]:
            return state["prompt"]
        last = state["trajectory"][-1]
        messages = concat_messages([last["prompt"], last["completion"]])
        response = await self.env_response(messages, state)
        if isinstance(response, tuple) and len(response) == 2 and isinstance(response[1], dict):
            response, new_state = response  # older verifiers envs return (messages, state)
            if new_state is not state:
                state.update(new_state)
        return concat_messages([messages, response or []])

    async def render_completion(self, state: State) -> None:
        if not state["trajectory"]:
            state["completion"] = "" if isinstance(state["prompt"], str) else []
            return
        last = state["trajectory"][-1]
        full = concat_messages([last["prompt"], last["completion"]])
        final = state.get("final_env_response")
        if final:
            full = concat_messages([full, final])
        state["completion"] = full[len(state["prompt"]) :]

    @cleanup(priority=100)
    async def render_state(self, state: State) -> None:
        """Stamp the end of generation and render the completion before user cleanups."""
        state["timing"].generation.end = time.time()
        await self.render_completion(state)

    async def add_trajectory_step(self, state: State, trajectory_step: TrajectoryStep) -> None:
        state["trajectory"].append(trajectory_step)

    async def add_model_response(self, state: State, prompt_messages: Messages, response: Response) -> None:
        if isinstance(prompt_messages, str):
            completion: Messages = response.message.content or ""
        else:
            completion = [response_to_message(response)]
        truncated = bool(response.message.is_truncated)
        if truncated:
            state["is_truncated"] = True
        step: TrajectoryStep = {
            "prompt": prompt_messages,
            "completion": completion,
            "response": response,
            "tokens": step_tokens(response),
            "reward": None,
            "advantage": None,
            "is_truncated": truncated,
            "trajectory_id": state["trajectory_id"],
            "extras": {},
        }
        await self.add_trajectory_step(state, step)

    # ---- the loop
    async def _rollout_loop(self, state: State) -> State:
        timing = state["timing"]
        timing.generation.start = timing.setup.start = time.time()
        try:
            new_state = await self.setup_state(state)
            if new_state is not None:
                state = new_state
        except ModelAuthError:
            raise
        except Exception as exc:
            state["error"] = exc
        finally:
            timing.setup.end = time.time()
        while not await self.is_completed(state):
            try:
                t0 = time.time()
                prompt_messages = await self.get_prompt_messages(state)
                if state["trajectory"]:
                    timing.env.spans.append(TimeSpan(start=t0, end=time.time()))
                if state.get("final_env_response") is not None:
                    continue
                t0 = time.time()
                response = await self.get_model_response(state, prompt_messages)
                timing.model.spans.append(TimeSpan(start=t0, end=time.time()))
                await self.add_model_response(state, prompt_messages, response)
            except ModelAuthError:
                raise
            except OverlongPromptError:
                state["prompt_too_long"] = True
                state["is_truncated"] = True
            except Exception as exc:
                state["error"] = exc
        return state

    async def rollout(
        self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None = None
    ) -> State:
        state = await self.init_state(input, client, model, sampling_args)
        holder = [state]

        async def loop() -> None:
            holder[0] = await self._rollout_loop(holder[0])

        try:
            if self.timeout_seconds:
                async with asyncio.timeout(self.timeout_seconds):
                    await loop()
            else:
                await loop()
        except asyncio.TimeoutError:
            st = holder[0]
            st["timed_out"] = True
            st["is_completed"] = True
            st["stop_condition"] = "timeout_reached"
        finally:
            await self.cleanup(holder[0])
        return holder[0]


class SingleTurnEnv(MultiTurnEnv):
    """One model response per rollout (Q&A)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_turns", 1)
        super().__init__(**kwargs)

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        """Never called (one turn); calling it is an error, as in the reference."""
        raise NotImplementedError("SingleTurnEnv has no environment response")
