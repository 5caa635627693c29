"""group-setup-env: a SandboxEnv for the tests of `setup_scope` (issue 28).

Its setup (`post_sandbox_setup`) writes /tmp/seed.txt ("seed <example_id>") in the
sandbox, appends one line "<pid> <example_id>" to a file on the host (`counter_path`:
how many times the setup ran, whatever process ran it) and records `seeded_for` in the
state (a group setup copies it into each rollout's state).

The scripted policy (`scripted_policy`) makes one bash call per rollout: it prints the
seed, writes a file of its own, waits (`linger` seconds: the group's siblings write
theirs meanwhile) and counts the `mine-*` files it sees: 1 when the rollouts' sandboxes
are isolated. Reward 1 when the seed was there, `seeded_for` reached the state and the
count is 1.
"""

from __future__ import annotations

import os

import envs as vf


class GroupSetupEnv(vf.SandboxEnv):
    def __init__(self, counter_path: str, **kwargs):
        super().__init__(**kwargs)
        self.counter_path = counter_path

    async def post_sandbox_setup(self, state):
        example = state["example_id"]
        await self.get_sandbox(state).write_file("/tmp/seed.txt", f"seed {example}\n")
        with open(self.counter_path, "a") as f:
            f.write(f"{os.getpid()} {example}\n")
        state["seeded_for"] = example


def isolated_and_seeded(state, completion) -> float:
    tool = [m["content"] for m in completion if m.get("role") == "tool"]
    if not tool:
        return 0.0
    lines = tool[0].splitlines()
    example = state["example_id"]
    return float(lines[:1] == [f"seed {example}"] and lines[-1:] == ["1"] and state.get("seeded_for") == example)


def load_environment(counter_path: str, num_examples: int = 4, **kwargs) -> vf.Environment:
    rows = [{"question": f"example {i}", "answer": ""} for i in range(num_examples)]
    return GroupSetupEnv(counter_path, dataset=rows, rubric=vf.Rubric(funcs=[isolated_and_seeded]), max_turns=3,
                         sandbox_name="group-setup", timeout_per_command_seconds=60, **kwargs)


def scripted_policy(linger: float = 1.5):
    from testmodel.model_server import Reply, ToolCallSpec

    command = (f"cat /tmp/seed.txt; echo x > /tmp/mine-$$-$RANDOM; sleep {linger}; "
               "ls /tmp | grep -c '^mine-'")

    def policy(req):
        if req.n_tool_turns() == 0:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": command})])
        return Reply(content="done")

    return policy
