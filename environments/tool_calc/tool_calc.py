"""tool-calc: a ToolEnv where the model may call a `calculator` tool.

Reward: the boxed final answer equals the result (weight 1); the number of
tool calls is tracked as a metric by ToolEnv itself.
"""

import ast
import operator
import random

import envs as vf

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only integer + - * are supported")


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: e.g. "12 * (3 + 4)"; integers with + - * and parentheses.
    """
    return str(_eval(ast.parse(expression.strip(), mode="eval")))


def load_environment(num_eval: int = 50, seed: int = 7, max_turns: int = 4) -> vf.Environment:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_eval):
        a, b, c = rng.randint(10, 999), rng.randint(10, 999), rng.randint(2, 30)
        expr = f"({a} + {b}) * {c}"
        rows.append({"question": f"Use the calculator to compute {expr}.", "answer": str((a + b) * c)})
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.ToolEnv(
        tools=[calculator],
        dataset=rows,
        system_prompt="Use the calculator tool, then give the final answer in \\boxed{}.",
        parser=parser,
        rubric=vf.Rubric(funcs=[correct_answer], parser=parser),
        max_turns=max_turns,
    )
