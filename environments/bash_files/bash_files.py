"""bash-files: a file-system task solved with a bash shell in a sandbox.

Each rollout gets a fresh sandbox holding a small tree of log files under
/task (written by `post_sandbox_setup`). The model must count the lines that
contain `ERROR` in every `*.log` file below /task (recursively; other files
do not count) and write that number to /task/answer.txt. The shell is
persistent, so `cd /task` in one call holds for the next.

Scoring reads the sandbox, not the chat: `post_rollout` fetches
/task/answer.txt before the sandbox is deleted.
  - answer_file (weight 1): /task/answer.txt holds the right count
  - boxed_answer (weight 0, metric): the final message's \\boxed{} agrees
Env args: num_eval, seed, max_turns, timeout_per_command_seconds, pool_size (default: warm pool sized from -c; 0 = off).
"""

from __future__ import annotations

import random

import envs as vf

LEVELS = ["INFO", "DEBUG", "WARN", "ERROR"]
SYSTEM_PROMPT = (
    "You have a bash shell (the `bash` tool) in a Linux sandbox; it keeps its working directory and "
    "variables between calls. Solve the task with shell commands, then reply with the number as \\boxed{N}."
)


def make_tree(rng: random.Random) -> tuple[dict[str, str], int]:
    """Files (path -> content) under /task and the number of ERROR lines in *.log files."""
    files: dict[str, str] = {}
    count = 0
    services = rng.sample(["api", "db", "auth", "worker", "cache", "web"], k=rng.randint(2, 4))
    for svc in services:
        for day in range(rng.randint(1, 3)):
            lines = []
            for i in range(rng.randint(5, 40)):
                level = rng.choices(LEVELS, weights=[6, 3, 2, 1])[0]
                lines.append(f"2026-11-{day + 1:02d}T10:{i % 60:02d}:00 {level} {svc}: event {rng.randint(1, 9999)}")
                count += level == "ERROR"
            files[f"/task/{svc}/day{day + 1}.log"] = "\n".join(lines) + "\n"
        # decoys: not *.log, must not be counted
        files[f"/task/{svc}/notes.txt"] = f"ERROR budget for {svc}: {rng.randint(1, 5)}\n"
    files["/task/README"] = "Count ERROR lines in *.log files below /task; write the number to /task/answer.txt\n"
    return files, count


class BashFilesEnv(vf.SandboxEnv):
    """Writes the rollout's files before the model starts; reads the answer file after."""

    async def post_sandbox_setup(self, state):
        sandbox = self.get_sandbox(state)
        for path, content in state["info"]["files"].items():
            await sandbox.write_file(path, content)

    async def post_rollout(self, state):
        sandbox = self.get_sandbox(state)
        r = await sandbox.exec(["cat", "/task/answer.txt"], timeout=10)
        state["answer_file"] = r.stdout.strip() if r.exit_code == 0 else None


def load_environment(
    num_eval: int = 20, seed: int = 5, max_turns: int = 8, timeout_per_command_seconds: int = 30, pool_size: int | None = None,
    **kwargs,
) -> vf.Environment:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_eval):
        files, count = make_tree(rng)
        rows.append({
            "question": "Count the lines containing ERROR in all *.log files under /task (recursively) and write "
                        "the number to /task/answer.txt.",
            "answer": str(count),
            "info": {"files": files},
        })
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def answer_file(state, answer) -> float:
        return 1.0 if state.get("answer_file") == answer else 0.0

    def boxed_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return BashFilesEnv(
        dataset=rows,
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=vf.Rubric(funcs=[answer_file, boxed_answer], weights=[1.0, 0.0], parser=parser),
        max_turns=max_turns,
        sandbox_name="bash-files",
        timeout_per_command_seconds=timeout_per_command_seconds,
        pool_size=pool_size,
        **kwargs,
    )


def scripted_policy():
    """A scripted solver for the offline demo and the end-to-end tests (serve it with
    `python -m testmodel.model_server --policy py:bash_files:scripted_policy`):
    cd in one call, count in the next (relies on the persistent shell), then box the number."""
    from testmodel.model_server import Reply, ToolCallSpec

    count = ("grep -r --include='*.log' -c ERROR . | awk -F: '{s += $2} END {print s}' > answer.txt; "
             "cat answer.txt")

    def policy(req):
        turn = req.n_tool_turns()
        if turn == 0:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": "cd /task && ls"})])
        if turn == 1:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": count})])
        return Reply(content=f"\\boxed{{{req.tool_results()[-1].strip()}}}")

    return policy
