"""`JudgeRubric`: an LLM judges the answer (MathRubric: math_rubric.py)."""

from __future__ import annotations

from typing import Any

from ..parsers import Parser
from ..types import Messages, State
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
