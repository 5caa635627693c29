"""`NeMoRLChatCompletionsClient` (`client_type = "nemorl_chat_completions"`): chat
completions against NeMo Gym's vllm_model server, which fixes retokenization
on the server side.

That server puts the engine's tokens in the assistant message it returns
(`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`), and
wants every earlier assistant message of the conversation to carry its own
ones back. So: on the way out, the assistant messages of the prompt are
annotated from the rollout's trajectory (its last steps, in order, one per
assistant message; a copy: the caller's messages are untouched); on the way
in, the message's fields become the response's tokens (the trajectory
step's `tokens`). Callers pass `state=` (`wants_state`), as for the token
client.
"""

from __future__ import annotations

from typing import Any

from ..types import Response, SamplingArgs
from .openai_clients import OpenAIChatCompletionsClient

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _token_id(value: Any) -> int:
    """An id as NeMo Gym writes it: an int, or "token_id:<n>"."""
    return int(value.rsplit(":", 1)[-1]) if isinstance(value, str) else int(value)


def with_trajectory_tokens(prompt: list[Any], state: Any) -> list[Any]:
    """`prompt` with its last assistant messages annotated from the trajectory's last steps."""
    steps = [s.get("tokens") for s in (state.get("trajectory") or [])]
    out = [dict(m) if isinstance(m, dict) else m for m in prompt]
    assistants = [i for i, m in enumerate(out) if isinstance(m, dict) and m.get("role") == "assistant"]
    n = min(len(assistants), len(steps))
    for i, tokens in zip(assistants[len(assistants) - n:], steps[len(steps) - n:]):
        if not tokens:
            continue
        for field, key in zip(TOKEN_FIELDS, ("prompt_ids", "completion_ids", "completion_logprobs")):
            if tokens.get(key) is not None:
                out[i][field] = list(tokens[key])
    return out


class NeMoRLChatCompletionsClient(OpenAIChatCompletionsClient):
    """NeMo Gym's vllm_model server (see the module docstring)."""

    wants_state = True

    async def get_native_response(self, prompt: Any, model: str, sampling_args: SamplingArgs,
                                  tools: list[Any] | None = None, **kwargs: Any) -> Any:
        state = kwargs.pop("state", None)
        if state is not None and isinstance(prompt, list):
            prompt = with_trajectory_tokens(prompt, state)
        return await super().get_native_response(prompt, model, sampling_args, tools, **kwargs)

    def from_native_response(self, response: Any) -> Response:
        if not isinstance(response, dict):
            response = response.model_dump()
        choice = dict(response["choices"][0])
        msg = dict(choice["message"])
        prompt_ids, gen_ids, gen_lps = (msg.pop(f, None) for f in TOKEN_FIELDS)
        if prompt_ids is not None and gen_ids is not None:
            response = {**response, "prompt_token_ids": [_token_id(t) for t in prompt_ids]}
            choice["token_ids"] = [_token_id(t) for t in gen_ids]
            if gen_lps:
                choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": lp, "top_logprobs": []}
                                                  for t, lp in zip(choice["token_ids"], gen_lps)]}
        choice["message"] = msg
        return super().from_native_response({**response, "choices": [choice, *response["choices"][1:]]})
