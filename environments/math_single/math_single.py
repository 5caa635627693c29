"""math-single: a SingleTurnEnv of generated arithmetic questions.

Written against the reference API; it ports from `verifiers` by changing only
the import line. Reward: 1 when the last \\boxed{} answer equals the result.
"""

import random

import envs as vf


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        op = rng.choice(["+", "-", "*"])
        expr = f"{a} {op} {b} * {c}"
        rows.append({"question": f"What is {expr}?", "answer": str(eval(expr)), "info": {"expr": expr}})
    return rows


def load_environment(num_train: int = 200, num_eval: int = 100, seed: int = 0, system_prompt: str | None = None) -> vf.Environment:
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    def answer_length(completion) -> float:
        return float(len(parser.last_assistant_text(completion) or ""))

    rubric = vf.Rubric(funcs=[correct_answer, answer_length], weights=[1.0, 0.0], parser=parser)
    return vf.SingleTurnEnv(
        dataset=make_rows(num_train, seed),
        eval_dataset=make_rows(num_eval, seed + 1),
        system_prompt=system_prompt or "Think briefly, then give the final answer in \\boxed{}.",
        parser=parser,
        rubric=rubric,
    )
