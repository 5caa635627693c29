"""Rubric scoring: weights, metrics, group functions, signature-based arguments."""


import pytest

import envs as vf
from envs.types import State


def _state(completion_text: str, answer: str, example_id: int = 0) -> State:
    s = State(input={"prompt": [{"role": "user", "content": "q"}], "answer": answer, "example_id": example_id, "info": {"k": 1}})
    s["completion"] = [{"role": "assistant", "content": completion_text}]
    s["metrics"] = {}
    return s


async def test_weights_metrics_and_signature_passing():
    seen = {}

    def exact(completion, answer, parser) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    async def length(completion, **kwargs) -> float:
        seen["kwargs"] = set(kwargs)
        return float(len(completion[0]["content"]))

    def uses_info(info, state, prompt, example_id, task) -> float:
        assert state["answer"] == "4" and prompt[0]["content"] == "q" and task == "default"
        return float(info["k"] + example_id)

    rubric = vf.Rubric(funcs=[exact, length, uses_info], weights=[1.0, 0.0, 0.5], parser=vf.Parser(extract_fn=vf.extract_boxed_answer))
    s = _state("\\boxed{4}", "4", example_id=2)
    await rubric.score_rollout(s)
    assert s["metrics"] == {"exact": 1.0, "length": 9.0, "uses_info": 3.0}
    assert s["reward"] == pytest.approx(1.0 + 0.5 * 3.0)
    assert {"answer", "state", "parser", "prompt", "info"} <= seen["kwargs"]


async def test_group_reward_function_and_advantage():
    def rank(completions, answers, states) -> list[float]:
        return [float(i) for i in range(len(completions))]

    rubric = vf.Rubric(funcs=[rank])
    states = [_state("a", "x"), _state("b", "x"), _state("c", "x")]
    await rubric.score_group(states)
    assert [s["reward"] for s in states] == [0.0, 1.0, 2.0]
    assert [s["advantage"] for s in states] == [-1.0, 0.0, 1.0]


async def test_raising_func_is_an_env_error_unless_opted_in_but_infra_error_propagates():
    from envs.outputs import error_verdict

    def boom(completion) -> float:
        raise RuntimeError("bug in reward")

    rubric = vf.Rubric(funcs=[boom, lambda completion: 1.0])
    s = _state("a", "x")
    await rubric.score_rollout(s)  # never a silent 0: the rollout is the env's error
    assert type(s["error"]).__name__ == "ScoringError" and s["reward"] == 0.0 and error_verdict(s["error"]) == "env"
    assert "boom raised RuntimeError: bug in reward" in str(s["error"]) and s["advantage"] is None
    rubric.set_exceptions_score_zero()  # explicit opt-in: 0, and the state says so
    s = _state("a", "x")
    await rubric.score_rollout(s)
    assert s.get("error") is None and s["metrics"]["boom"] == 0.0 and s["reward"] == 1.0
    assert s["scoring_errors"] == [{"function": "boom", "error": "RuntimeError: bug in reward", "scored": 0.0}]

    def infra(completion) -> float:
        raise RuntimeError("wrapped") from vf.InfraError("sandbox died")

    with pytest.raises(RuntimeError):
        await vf.Rubric(funcs=[infra]).score_rollout(_state("a", "x"))


async def test_errored_rollout_gets_zero_reward_and_keeps_env_metrics():
    rubric = vf.Rubric(funcs=[lambda completion: 1.0])
    s = _state("a", "x")
    s["error"] = vf.ModelError("down")
    s["metrics"] = {"sandbox_ready_s": 1.5}
    await rubric.score_rollout(s)
    assert s["reward"] == 0.0 and s["metrics"]["sandbox_ready_s"] == 1.5


async def test_class_objects_and_add_metric():
    rubric = vf.Rubric()
    rubric.add_class_object("target", 3)
    rubric.add_reward_func(lambda completion, target: float(target), weight=2.0)
    rubric.add_metric(lambda completion: 5.0)
    s = _state("a", "x")
    await rubric.score_rollout(s)
    assert s["reward"] == 6.0  # both lambdas share the metric name "<lambda>"


async def test_rubric_group_sums_and_merges():
    r1 = vf.Rubric(funcs=[lambda completion: 1.0])
    r2 = vf.Rubric(funcs=[lambda completion: 0.5])

    def named(completion):
        return 2.0

    r2.add_metric(named)
    group = vf.RubricGroup(rubrics=[r1, r2])
    s = _state("a", "x")
    await group.score_rollout(s)
    assert s["reward"] == 1.5 and s["metrics"]["named"] == 2.0


async def test_math_rubric():
    r = vf.MathRubric()
    good, bad = _state("so \\boxed{0.5}", "1/2"), _state("\\boxed{3}", "4")
    good["answer_override"] = None
    await r.score_rollout(_state("\\boxed{ 12 }", "12"))
    s = _state("\\boxed{12}", "12")
    await r.score_rollout(s)
    assert s["reward"] == 1.0
    await r.score_rollout(bad)
    assert bad["reward"] == 0.0
    same = _state("<think>hmm</think> so \\boxed{x + 1}", "1 + x")  # math-verify: equivalent, not equal strings
    await r.score_rollout(same)
    assert same["reward"] == 1.0
    await r.teardown()


async def test_judge_rubric_against_local_server():
    from openai import AsyncOpenAI

    from testmodel.model_server import ModelServer, fixed

    async with ModelServer(fixed("yes")) as srv:
        judge = vf.JudgeRubric(judge_client=AsyncOpenAI(base_url=srv.base_url, api_key="x"), judge_model="judge")

        async def judged(prompt, completion, answer, state, judge) -> float:
            return 1.0 if "yes" in (await judge(prompt, completion, answer, state)).lower() else 0.0

        judge.add_reward_func(judged)
        s = _state("4", "4")
        await judge.score_rollout(s)
        assert s["reward"] == 1.0
        assert srv.requests[0].model == "judge" and "Ground truth" in srv.requests[0].last_user_text()
        await judge.judge_client.close()
