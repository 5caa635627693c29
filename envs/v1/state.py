"""`State`: the mutable output of one v1 rollout.

It starts from a task and accumulates trajectory, completion, metrics, reward,
timing, artifacts, errors and the program's own serialisable fields.
Framework-managed fields (`is_completed`, `stop_condition`, `is_truncated`,
`error`) cannot be written directly: use `state.stop(...)` or raise a
`vf.Error`. Runtime handles (the model endpoint, tools, a sandbox) live in
`state.runtime`, outside the dict, so they never reach serialisation;
`state.for_task(child, borrow=[...])` shares chosen handles with a child
rollout.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sandboxes.errors import ConfigError, UsageError

from ..types import RolloutTiming
from .task import Task

MANAGED_FIELDS = frozenset({"is_completed", "stop_condition", "is_truncated", "error"})
BORROWABLE = frozenset({"model", "client", "sandbox", "tools", "endpoint"})
APIS = ("chat_completions", "responses", "anthropic_messages")


class _HybridMethod:
    """`State.for_task(task)` (a fresh state) and `state.for_task(task, borrow=...)` (a child)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __get__(self, obj: Any, cls: type) -> Callable[..., Any]:
        return lambda *a, **k: self.fn(cls, obj, *a, **k)


class State(dict):
    """Per-rollout v1 state (see the module docstring)."""

    def __init__(self, data: Mapping[str, Any] | None = None, /, **fields: Any):
        super().__init__()
        self.runtime: dict[str, Any] = {}
        for k, v in {**(dict(data) if data else {}), **fields}.items():
            dict.__setitem__(self, k, v)

    # ---- guarded writes
    def __setitem__(self, key: str, value: Any) -> None:
        if key in MANAGED_FIELDS:
            raise UsageError(f"state[{key!r}] is managed by the framework: use state.stop(...) or raise a vf.Error")
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def _set(self, key: str, value: Any) -> None:
        """Framework write of a managed field."""
        dict.__setitem__(self, key, value)

    # ---- construction
    @_HybridMethod
    def for_task(cls, parent: "State | None", task: Mapping[str, Any], borrow: list[str] | tuple[str, ...] = (),
                 tools: str | list[str] | None = None) -> "State":
        """A fresh state for `task`. Called on a state, `borrow` names the runtime
        handles the child shares with it (model, client, endpoint, sandbox, tools) and
        `tools` limits the borrowed tools to those names."""
        task = task if isinstance(task, Task) else Task(task)
        now = time.time()
        state = cls(
            prompt=list(task.get("prompt") or []), answer=task.get("answer", ""), info=dict(task.get("info") or {}),
            example_id=task.get("example_id", 0), trajectory=[], trajectory_id=uuid.uuid4().hex,
            completion=None, reward=None, metrics={}, timing=RolloutTiming(start_time=now), usage={},
        )
        for key in ("is_completed", "is_truncated"):
            state._set(key, False)
        state._set("stop_condition", None)
        state._set("error", None)
        state.runtime["task"] = task
        unknown = set(borrow) - BORROWABLE
        if unknown:
            raise ConfigError(f"cannot borrow {sorted(unknown)}; borrowable: {sorted(BORROWABLE)}")
        if borrow and parent is None:
            raise ConfigError("borrow= needs a parent state: call it as state.for_task(...)")
        for name in borrow:
            if name in parent.runtime:
                state.runtime[name] = parent.runtime[name]
            if name == "model":
                for k in ("client", "endpoint", "sampling_args"):
                    if k in parent.runtime:
                        state.runtime.setdefault(k, parent.runtime[k])
        if tools is not None and "tools" in state.runtime:
            names = [tools] if isinstance(tools, str) else list(tools)
            state.runtime["tools"] = {n: t for n, t in state.runtime["tools"].items() if n in names}
        state.runtime["borrowed"] = list(borrow)
        return state

    # ---- control
    def stop(self, condition: str = "state_done") -> None:
        self._set("is_completed", True)
        self._set("stop_condition", condition)

    def get_model(self) -> str:
        model = self.runtime.get("model")
        if not model:
            raise UsageError("this state has no model: run it through a Harness (or borrow the parent's model)")
        return model

    def get_endpoint_config(self, api: str = "chat_completions") -> dict[str, str]:
        """{"base_url", "api_key", "model"} of the interception endpoint for this rollout."""
        if api not in APIS:
            raise UsageError(f"api {api!r} is not served by the v1 endpoint; supported: {list(APIS)}")
        endpoint = self.runtime.get("endpoint")
        if endpoint is None:
            raise UsageError("this state has no model endpoint: run it through a Harness")
        base = endpoint["base_url"]
        if api == "anthropic_messages":  # the Anthropic SDK appends /v1/messages itself
            base = base[: -len("/v1")] if base.endswith("/v1") else base
        return {"base_url": base, "api_key": endpoint["api_key"], "model": self.get_model()}

    def get_client(self, api: str = "chat_completions", *, sync: bool = False) -> Any:
        """An SDK client on the interception endpoint (every call is recorded): OpenAI's for
        "chat_completions" and "responses", Anthropic's for "anthropic_messages"; one per
        (api, sync) for the rollout, closed by the harness when the rollout ends."""
        cfg = self.get_endpoint_config(api)
        import openai

        clients = self.runtime.setdefault("sdk_clients", {})
        client = clients.get((api, sync))
        if client is None:
            if api == "anthropic_messages":
                import anthropic

                cls = anthropic.Anthropic if sync else anthropic.AsyncAnthropic
            else:  # chat completions and Responses: the OpenAI SDK
                cls = openai.OpenAI if sync else openai.AsyncOpenAI
            client = clients[(api, sync)] = cls(base_url=cfg["base_url"], api_key=cfg["api_key"], max_retries=0)
        return client

    async def close_clients(self) -> None:
        """Close the SDK clients `get_client` made (the harness does when the rollout ends)."""
        for client in self.runtime.pop("sdk_clients", {}).values():
            try:
                result = client.close()
                if hasattr(result, "__await__"):
                    await result
            except Exception:  # a client the program closed itself, or its loop is gone
                pass

    def get_tools(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return dict(self.runtime.get("tools") or {})

    def get_max_turns(self, default: int) -> int:
        task = self.runtime.get("task") or {}
        value = task.get("max_turns")
        return int(value) if value is not None else int(default)

    def finalize(self) -> "State":
        """Fill `completion` from the trajectory when the program did not set it,
        close the generation span; returns self."""
        if self.get("completion") is None:
            traj = self.get("trajectory") or []
            if traj:
                last = traj[-1]
                full = list(last["prompt"]) + list(last["completion"])
                prompt_len = len(self.get("prompt") or [])
                system = sum(1 for m in last["prompt"] if m.get("role") == "system")
                dict.__setitem__(self, "completion", full[prompt_len + system:])
            else:
                dict.__setitem__(self, "completion", [])
        timing = self.get("timing")
        if isinstance(timing, RolloutTiming) and not timing.generation.end:
            timing.generation.end = time.time()
        return self

    def serializable(self) -> dict[str, Any]:
        """The state as plain data (runtime handles stripped: they are not dict items)."""
        return dict(self)
