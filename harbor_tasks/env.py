"""`HarborEnv`: an agent eval over Harbor tasks. Each rollout gets a sandbox of its
task's image (built from environment/Dockerfile by the backend's image builder),
as the task's agent user, with the task's network policy, resources and workdir;
the model gets the task's instruction.md as its prompt and the `bash` tool of
`SandboxEnv`. When the agent stops (its answer, `max_turns`, or
`[agent].timeout_sec`), the task's tests run in that same sandbox exactly as
Harbor's verifier runs them (`harbor_tasks.phases.run_verifier`), and the
rollout's reward is Harbor's `reward` (reward.json's "reward" key or reward.txt).

A reward file that is missing, empty or unparsable is reward 0 with the reason in
the row's `info["harbor"]["error"]` (Harbor records the trial as an exception with
no reward). A task this stack cannot honour (an allowlist network, a user switch
the sandbox cannot make, multi-step, ...) fails its rollout with a
`TaskUnsupported` usage error naming what, before the model is called.

    vf-sandbox eval harbor-tasks -a '{"dataset": "examples/harbor_tasks"}' -m MODEL
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from envs.decorators import stop
from envs.rubrics.rubric import Rubric
from envs.sandbox_env import SandboxEnv
from envs.types import State
from sandboxes import SandboxSpec

from .phases import run_verifier
from .sandbox import build_image, sandbox_spec
from .task import HarborTask, TaskUnsupported

log = logging.getLogger(__name__)

SYSTEM_PROMPT = ("You are working in a Linux sandbox. Use the bash tool to run commands; its shell keeps its "
                 "working directory and variables between calls. Complete the task, then reply with a short "
                 "summary and no tool call.")
INFO_KEY = "harbor"


class HarborRubric(Rubric):
    """Harbor's reward: the task's tests run in the rollout's sandbox after the agent."""

    def __init__(self, env: "HarborEnv"):
        super().__init__()
        self._env = env

        async def harbor_reward(state: State) -> float:
            return await env.score(state)

        self.add_reward_func(harbor_reward, weight=1.0)


class HarborEnv(SandboxEnv):
    """Agent eval over Harbor tasks (module docstring)."""

    def __init__(self, tasks: list[HarborTask], *, input_errors: list[dict[str, Any]] | None = None,
                 system_prompt: str | None = SYSTEM_PROMPT, max_turns: int = 50, **kwargs: Any):
        self.tasks = {t.name: t for t in tasks}
        self.input_errors = list(input_errors or [])
        self._images: dict[str, asyncio.Future[str]] = {}
        rows = [{"prompt": [{"role": "user", "content": t.instruction}], "answer": "", "task": "harbor",
                 "info": {"instance_id": t.name, "task_path": str(t.path)}} for t in tasks]
        kwargs.setdefault("sandbox_name", "harbor-task")
        kwargs.setdefault("pool_size", 0)  # every task has its own image: nothing to keep warm
        kwargs.setdefault("rollout_isolation", "container")
        super().__init__(dataset=rows, rubric=HarborRubric(self), system_prompt=system_prompt, max_turns=max_turns,
                         keep_sandbox_for_scoring=True, **kwargs)

    def task_of(self, state: State) -> HarborTask:
        return self.tasks[(state.get("info") or {})["instance_id"]]

    async def image_of(self, task: HarborTask) -> str:
        """The task's image name, built once per run (concurrent rollouts share the build)."""
        fut = self._images.get(task.name)
        if fut is None:
            fut = self._images[task.name] = asyncio.ensure_future(build_image(task, self.backend))
        try:
            return (await asyncio.shield(fut)).name
        except BaseException:
            if fut.done():
                self._images.pop(task.name, None)  # a failed build is tried again by the next rollout
            raise

    def get_sandbox_spec(self, state: State) -> SandboxSpec:
        task = self.task_of(state)
        base = self.sandbox_spec
        return sandbox_spec(task, state["harbor_image"], getattr(self.backend, "name", "?"),
                            labels=dict(base.labels), isolation=base.isolation,
                            rollout_isolation=base.rollout_isolation)

    async def setup_state(self, state: State) -> State:
        task = self.task_of(state)
        why = task.unsupported()
        if why:
            raise TaskUnsupported(f"task {task.name}: {why}")
        state["harbor_image"] = await self.image_of(task)
        state = await super().setup_state(state)
        verifier_user = task.config.verifier.user
        if verifier_user != task.config.agent.user:  # refused now, before any model call, if the sandbox cannot switch
            await self.get_sandbox(state).exec(["true"], user="0" if verifier_user is None else str(verifier_user),
                                               timeout=30)
        state["harbor_agent_start"] = time.time()
        return state

    @stop
    async def agent_timeout_reached(self, state: State) -> bool:
        """`[agent].timeout_sec` of the task has passed since the sandbox was ready."""
        limit = self.task_of(state).config.agent.timeout_sec
        started = state.get("harbor_agent_start")
        return bool(limit and started and time.time() - started >= limit)

    async def score(self, state: State) -> float:
        """Run the task's tests in the rollout's sandbox; the reward (0 when none)."""
        if state.get("error") is not None or not state.get("sandbox_id"):
            return 0.0
        task = self.task_of(state)
        outcome = await run_verifier(self.get_sandbox(state), task)
        info = state.setdefault("info", {})
        info[INFO_KEY] = {"rewards": outcome.rewards, "error": outcome.error, "detail": outcome.detail,
                          "test_exit_code": outcome.run.exit_code, "tests_s": outcome.run.seconds,
                          "stdout_tail": outcome.run.log_tail[-2000:]}
        self.record_metric(state, "harbor_tests_s", outcome.run.seconds)
        return float(outcome.reward or 0.0)

    def build_metadata(self, outputs: list[Any], **fields: Any) -> dict[str, Any]:
        meta = super().build_metadata(outputs, **fields)
        meta["input_errors"] = self.input_errors
        return meta
