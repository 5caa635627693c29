"""v1-sandbox-agent: the v1 API end to end, with the program in a sandbox.

Taskset: each task writes a log file into the sandbox (`task["program"]["files"]`)
and asks how many of its lines contain ERROR. Harness: a command program,
`python3 /opt/vf_agent.py`, a stdlib-only agent that talks to the model with
OpenAI chat requests at $OPENAI_BASE_URL and runs the `bash` tool calls it gets
inside the sandbox. The sandbox keeps its network off: the agent's requests
reach the v1 interception endpoint through the relay over the sandbox's
command channel, and every model call lands in the rollout's trajectory.

Rewards: `correct` (the final \\boxed{} equals the count); metrics
`agent_exit_ok` and `recount_in_sandbox` (a child harness that borrows the
rollout's sandbox, `state.for_task(..., borrow=["model", "sandbox"])`, and
recounts there). Configure with eval TOML `[env.taskset]` (num_tasks, seed)
and `[env.harness]` (max_turns, sandbox = {image = ...}).
"""

from __future__ import annotations

import random

import envs as vf
from envs.v1 import EnvConfig, HarnessConfig, SandboxConfig, TasksetConfig

AGENT_PATH = "/opt/vf_agent.py"
AGENT_SOURCE = r'''
import json, os, subprocess, sys, urllib.request

task = json.loads(os.environ["VF_TASK_JSON"])
max_turns = int(os.environ.get("VF_MAX_TURNS", "8"))
messages = [{"role": "system", "content": task.get("system_prompt") or ""}] if task.get("system_prompt") else []
messages += task["prompt"]
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command in the sandbox.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def ask():
    body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages, "tools": tools}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)["choices"][0]["message"]


for _ in range(max_turns):
    msg = ask()
    messages.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")})
    if not msg.get("tool_calls"):
        print(msg.get("content") or "")
        sys.exit(0)
    for call in msg["tool_calls"]:
        command = json.loads(call["function"]["arguments"] or "{}").get("command", "")
        run = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": (run.stdout + run.stderr)[-4000:]})
print("out of turns", file=sys.stderr)
sys.exit(3)
'''

SYSTEM_PROMPT = "You have a `bash` tool in a Linux sandbox. Use it, then reply with the number as \\boxed{N}."


class AgentTasksetConfig(TasksetConfig):
    num_tasks: int = 3
    seed: int = 7


class AgentHarnessConfig(HarnessConfig):
    max_turns: int = 6
    sandbox: SandboxConfig | None = SandboxConfig(image="vf-sandbox/python:3.11", timeout_per_command_seconds=300)


class AgentEnvConfig(EnvConfig):
    taskset: AgentTasksetConfig
    harness: AgentHarnessConfig


def make_tasks(num: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        lines = [f"{rng.choice(['INFO', 'WARN', 'ERROR', 'DEBUG'])} event {rng.randint(1, 999)}"
                 for _ in range(rng.randint(5, 30))]
        rows.append({
            "prompt": "How many lines of /task/app.log contain ERROR?",
            "answer": str(sum("ERROR" in line for line in lines)),
            "program": {"files": {"/task/app.log": "\n".join(lines) + "\n"}},
        })
    return rows


def correct(task, state) -> float:
    completion = state.get("completion") or []
    text = completion[-1].get("content") if completion else ""
    return 1.0 if vf.extract_boxed_answer(text or "", strict=True) == task["answer"] else 0.0


CHECKER = vf.v1.Harness(program={"command": ["/bin/sh", "-c", "grep -c ERROR /task/app.log || true"]},
                        sandbox=SandboxConfig(image="vf-sandbox/python:3.11"))


async def recount_in_sandbox(task, state) -> float:
    """A child harness run in the rollout's own sandbox (borrowed, not a new one):
    recounts the ERROR lines there and checks the task's answer against it."""
    child = state.for_task({"prompt": "recount", "example_id": task.get("example_id")}, borrow=["model", "sandbox"])
    await CHECKER.run(child.runtime["task"], child)
    result = child.get("program_result") or {}
    return 1.0 if result.get("exit_code") == 0 and result.get("stdout", "").strip() == task["answer"] else 0.0


def agent_exit_ok(task, state) -> float:
    return 1.0 if (state.get("program_result") or {}).get("exit_code") == 0 else 0.0


def load_environment(config: AgentEnvConfig | None = None) -> vf.Environment:
    config = AgentEnvConfig.from_config(config)
    ts_cfg, h_cfg = config.taskset, config.harness
    taskset = vf.v1.Taskset(
        source=lambda: make_tasks(ts_cfg.num_tasks, ts_cfg.seed), taskset_id="v1-sandbox-agent",
        system_prompt=ts_cfg.system_prompt or SYSTEM_PROMPT, rewards=[correct], metrics=[agent_exit_ok, recount_in_sandbox],
    )
    harness = vf.v1.Harness(
        program={"command": ["python3", AGENT_PATH], "files": {AGENT_PATH: AGENT_SOURCE},
                 "env": {"VF_MAX_TURNS": str(h_cfg.max_turns)}, "timeout": 600},
        sandbox=h_cfg.sandbox, sampling_args=h_cfg.sampling_args, max_turns=h_cfg.max_turns,
    )
    return vf.v1.Env(taskset, harness)


def scripted_policy():
    """For the local model server: grep with the bash tool, then answer the tool's output boxed."""
    from testmodel.model_server import tool_then_answer

    return tool_then_answer("bash", {"command": "grep -c ERROR /task/app.log"},
                            answer=lambda req: "\\boxed{%s}" % req.tool_results()[-1].strip())
