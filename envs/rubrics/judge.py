"""`JudgeRubric` (LLM as judge) and `MathRubric` (boxed-answer equivalence)."""

from __future__ import annotations

import re
from typing import Any

from ..parsers import Parser
from ..types import Messages, State
from ..utils import extract_boxed_answer
from .rubric import Rubric

DEFAULT_JUDGE_PROMPT = """Given a ground truth answer and a response, determine if the response is correct.

Question:
```
{question}
```

Ground truth answer:
```
{answer}
```

Response:
```
{response}
```

Respond either "yes" or "no" only."""


class JudgeRubric(Rubric):
    """Adds a `judge` class object: `await judge(prompt, completion, answer, state)`
    returns the judge model's text (cached per rollout in state["judge_response"])."""

    def __init__(
        self,
        parser: Parser | None = None,
        judge_client: Any = None,
        judge_model: str = "gpt-4.1-nano",
        judge_sampling_args: dict[str, Any] | None = None,
        judge_prompt: str = DEFAULT_JUDGE_PROMPT,
        **kwargs: Any,
    ):
        super().__init__(parser=parser, **kwargs)
        self.judge_client = judge_client
        self.judge_model = judge_model
        self.judge_sampling_args = judge_sampling_args or {}
        self.judge_prompt = judge_prompt
        self.add_class_object("judge", self.judge)
        self.add_class_object("judge_client", judge_client)
        self.add_class_object("judge_model", judge_model)

    async def judge(self, prompt: Messages, completion: Messages, answer: str, state: State | None = None, **kwargs: Any) -> str:
        if isinstance(prompt, list):
            users = [m for m in prompt if m.get("role") == "user"]
            question = str(users[-1].get("content", "")) if users else ""
        else:
            question = str(prompt)
        response = self.parser.parse_answer(completion) or ""
        text = self.judge_prompt.format(question=question, answer=answer, response=response)
        cache = state.setdefault("judge_response", {}) if state is not None else {}
        if text in cache:
            return cache[text]
        if self.judge_client is None:
            import openai

            self.judge_client = openai.AsyncOpenAI()
        from ..clients import make_client

        client = make_client(self.judge_client)
        reply = await client.get_response([{"role": "user", "content": text}], self.judge_model, dict(self.judge_sampling_args))
        result = reply.message.content or ""
        cache[text] = result
        return result


def _normalise(text: str) -> str:
    text = text.strip().strip("$").replace(" ", "").replace("\\!", "").rstrip(".")
    text = re.sub(r"\\(?:text|mathrm)\{([^}]*)\}", r"\1", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("dfrac", "frac")
    return text


def answers_match(parsed: str, answer: str) -> bool:
    a, b = _normalise(parsed), _normalise(answer)
    if not a:
        return False
    if a == b:
        return True
    try:
        return abs(float(a.replace(",", "")) - float(b.replace(",", ""))) < 1e-6
    except ValueError:
        return False


class MathRubric(Rubric):
    """Reward 1 when the last \\boxed{} answer equals the reference (string or numeric
    equivalence; math-verify is used when installed)."""

    def __init__(self, parser: Parser | None = None, **kwargs: Any):
        super().__init__(parser=parser or Parser(extract_fn=lambda t: extract_boxed_answer(t, strict=True)), **kwargs)
        self.add_reward_func(self.correct_answer, 1.0)

    def correct_answer(self, completion: Messages, answer: str, **kwargs: Any) -> float:
        parsed = self.parser.parse_answer(completion) or ""
        try:
            from math_verify import parse, verify  # type: ignore[import-not-found]

            return 1.0 if verify(parse(f"\\boxed{{{answer}}}"), parse(f"\\boxed{{{parsed}}}")) else 0.0
        except ImportError:
            return 1.0 if answers_match(parsed, str(answer)) else 0.0
