"""Results rows as the reference documents RolloutOutput: `error` a string or
None (typed details in `error_info`), `tool_defs` per row, `trajectory` a
JSON-serialisable list of TrajectoryStep, bounded."""

from __future__ import annotations

import json

from openai import AsyncOpenAI

import envs as vf
from envs.errors import error_text
from envs.outputs import serialize_trajectory, state_to_output
from runs.results import sample_groups, summarize_eval
from testmodel.model_server import ModelServer, tool_then_answer
from envs.types import Response, RolloutTiming, State

STEP_KEYS = {"prompt", "completion", "response", "tokens", "reward", "advantage", "is_truncated", "trajectory_id", "extras"}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_tool_env_row_has_reference_fields_and_is_json():
    async with ModelServer(tool_then_answer("add", {"a": 2, "b": 3}, answer="5")) as srv:
        env = vf.ToolEnv(tools=[add], dataset=[{"question": "add", "answer": "5"}])
        out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m", num_examples=1, rollouts_per_example=1)
        await env.teardown()
    row = json.loads(json.dumps(out["outputs"][0]))  # JSON-serialisable as is (no default=)
    assert row["error"] is None and row["error_info"] is None
    assert [t["name"] for t in row["tool_defs"]] == ["add"] and row["tool_defs"][0]["parameters"]["required"] == ["a", "b"]
    traj = row["trajectory"]
    assert len(traj) == 2 and all(set(step) == STEP_KEYS for step in traj)
    assert traj[0]["completion"][0]["tool_calls"][0]["function"]["name"] == "add"
    assert traj[1]["prompt"][-1] == {"role": "tool", "content": "5", "tool_call_id": traj[0]["completion"][0]["tool_calls"][0]["id"]}
    assert traj[1]["response"]["message"]["content"] == "5" and traj[0]["trajectory_id"] == traj[1]["trajectory_id"]
    assert "trajectory_dropped_steps" not in row


def _failed_state() -> State:
    def inner():
        raise KeyError("missing")

    try:
        try:
            inner()
        except KeyError as exc:
            raise vf.ToolCallError("tool add failed") from exc
    except vf.ToolCallError as exc:
        err = exc
    return State(input={"prompt": "p", "example_id": 0}, timing=RolloutTiming(start_time=1.0), trajectory=[], error=err)


def test_error_is_a_string_with_typed_details_beside_it():
    row = state_to_output(_failed_state())
    assert row["error"] == "ToolCallError: tool add failed"
    info = row["error_info"]
    assert info["type"] == "ToolCallError" and info["kind"] == "task" and info["message"] == "tool add failed"
    assert info["chain"] == ["ToolCallError", "KeyError"]
    assert "in inner" in info["traceback"] and info["traceback"].rstrip().endswith("ToolCallError: tool add failed")
    assert row["error_type"] == "ToolCallError" and row["error_kind"] == "task"
    json.dumps(row)
    # the readers: runs show / dashboard summarise both this shape and rows written before error_info
    old = {"example_id": 1, "reward": 0.0, "error": {"type": "InfraError", "message": "gone", "kind": "infra"}}
    s = summarize_eval([dict(row), old])
    assert s["errors_by_type"] == {"ToolCallError": 1, "InfraError": 1} and s["errors_by_kind"] == {"task": 1, "infra": 1}
    texts = [r["error"] for g in sample_groups([dict(row), old])["groups"] for r in g["rollouts"]]
    assert texts == ["ToolCallError: tool add failed", "InfraError: gone"]
    assert error_text(None) is None and error_text("x: y") == "x: y"


def test_trajectory_is_bounded_keeping_the_latest_steps():
    def step(i: int) -> dict:
        prompt = [{"role": "user", "content": "x" * 1000 * (i + 1)}]  # each prompt repeats the conversation: grows
        return {"prompt": prompt, "completion": [{"role": "assistant", "content": f"a{i}"}], "response": Response(),
                "tokens": None, "reward": None, "advantage": None, "is_truncated": False, "trajectory_id": "t",
                "extras": {"obj": object()}}

    steps = [step(i) for i in range(10)]
    kept, dropped = serialize_trajectory(steps, max_chars=25_000)
    # last steps' prompts: 10k + 9k + 8k > 25k, so steps 8 and 9 fit and 0..7 are dropped
    assert dropped == 8 and [s["completion"][0]["content"] for s in kept] == ["a8", "a9"]
    json.dumps(kept)  # extras made JSON-able
    kept, dropped = serialize_trajectory(steps, max_chars=10)
    assert dropped == 9 and len(kept) == 1  # the last step is always kept
    state = State(input={"prompt": "p", "example_id": 0}, timing=RolloutTiming(start_time=1.0), trajectory=steps)
    import envs.outputs as outputs

    old, outputs.TRAJECTORY_MAX_CHARS = outputs.TRAJECTORY_MAX_CHARS, 25_000
    try:
        row = state_to_output(state)
    finally:
        outputs.TRAJECTORY_MAX_CHARS = old
    assert len(row["trajectory"]) == 2 and row["trajectory_dropped_steps"] == 8
