"""python-math: number problems the model solves by running Python in a sandbox.

The model gets one tool, `python(code)`, backed by a persistent interpreter in
its own sandbox (PythonEnv): variables survive between calls, so it can build
a result in steps. Each question names a computation too long to do by hand
(sums of primes, modular powers, digit sums of factorials, Collatz lengths);
the reference answer is computed here with the same code.

Reward: the final answer in \\boxed{} equals the reference (weight 1).
Env args: num_eval, seed, max_turns, packages (pip packages baked into the
sandbox image, e.g. "sympy"), timeout_per_command_seconds, pool_size.
"""

from __future__ import annotations

import math
import random

import envs as vf

SYSTEM_PROMPT = (
    "You have a persistent Python interpreter (the `python` tool). Use it to compute the answer; "
    "variables persist between calls. Give the final answer as \\boxed{N}."
)


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return [i for i, v in enumerate(sieve) if v]


def _collatz_len(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def make_problem(rng: random.Random) -> dict[str, str]:
    """One question with its reference answer and a Python expression that computes it."""
    kind = rng.choice(["primes", "modpow", "factorial_digits", "collatz"])
    if kind == "primes":
        n = rng.randint(1_000, 50_000)
        code = (
            f"n = {n}\nsieve = [True] * n\nsieve[0] = sieve[1] = False\n"
            "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
            "        sieve[i*i::i] = [False] * len(sieve[i*i::i])\n"
            "sum(i for i, p in enumerate(sieve) if p)"
        )
        return {"question": f"What is the sum of all prime numbers below {n}?",
                "answer": str(sum(_primes_below(n))), "code": code}
    if kind == "modpow":
        a, b, m = rng.randint(2, 999), rng.randint(10**5, 10**7), rng.choice([10**9 + 7, 998_244_353, 1_000_003])
        return {"question": f"What is {a} raised to the power {b}, modulo {m}?",
                "answer": str(pow(a, b, m)), "code": f"pow({a}, {b}, {m})"}
    if kind == "factorial_digits":
        n = rng.randint(100, 600)
        return {"question": f"What is the sum of the decimal digits of {n}! ({n} factorial)?",
                "answer": str(sum(map(int, str(math.factorial(n))))),
                "code": f"import math\nsum(int(d) for d in str(math.factorial({n})))"}
    n = rng.randint(10_000, 10**6)
    code = f"n, steps = {n}, 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\nsteps"
    return {"question": f"How many steps does the Collatz sequence starting at {n} take to reach 1?",
            "answer": str(_collatz_len(n)), "code": code}


def load_environment(
    num_eval: int = 20,
    seed: int = 11,
    max_turns: int = 6,
    packages: str = "",
    timeout_per_command_seconds: int = 30,
    pool_size: int | None = None,
    **kwargs,
) -> vf.Environment:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_eval):
        p = make_problem(rng)
        rows.append({"question": p["question"], "answer": p["answer"], "info": {"reference_code": p["code"]}})
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.PythonEnv(
        pip_install_packages=packages,
        dataset=rows,
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=vf.Rubric(funcs=[correct_answer], parser=parser),
        max_turns=max_turns,
        sandbox_name="python-math",
        timeout_per_command_seconds=timeout_per_command_seconds,
        pool_size=pool_size,
        **kwargs,
    )


def scripted_policy():
    """A scripted solver for the offline demo and the end-to-end tests (serve it with
    `python -m testmodel.model_server --policy py:python_math:scripted_policy`).
    Looks the question up in the env's own dataset and solves it in two cells:
    everything but the last line first, then the final expression (namespace kept)."""
    from testmodel.model_server import Reply, ToolCallSpec

    code_of = {}
    for row in load_environment(num_eval=20, pool_size=0).get_eval_dataset():
        code_of[row["question"]] = row["info"]["reference_code"]

    def policy(req):
        code = code_of[req.last_user_text().strip()]
        lines = code.split("\n")
        turn = req.n_tool_turns()
        if turn == 0:
            return Reply(tool_calls=[ToolCallSpec("python", {"code": "\n".join(lines[:-1]) or "pass"})])
        if turn == 1:
            return Reply(tool_calls=[ToolCallSpec("python", {"code": lines[-1]})])
        out = req.tool_results()[-1]
        value = out.split("Out[", 1)[1].split("]: ", 1)[1].strip()
        return Reply(content=f"The answer is \\boxed{{{value}}}.")

    return policy
