"""Sync user code (reward functions, tools) runs in the env's thread pool, off
the event loop: the loop keeps serving other coroutines while it runs, the
pool's size follows `set_concurrency`, and failures are reported as before.
No timing assertions: concurrency is observed by counting, progress by ticks."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from openai import AsyncOpenAI

import envs as vf
from envs.sync_pool import SyncPool, is_async_callable
from testmodel.model_server import ModelServer, compute, tool_then_answer


def rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def client_for(srv: ModelServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=srv.base_url, api_key="x")


class InFlight:
    """Counts how many calls run at once (max seen), from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.threads: set[int] = set()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
            self.threads.add(threading.get_ident())

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


async def test_sync_reward_runs_off_the_loop_while_the_loop_makes_progress():
    loop_thread = threading.get_ident()
    seen: list[int] = []
    ticks_during: list[int] = []
    ticks = [0]
    started = threading.Event()

    def slow_reward(completion) -> float:
        seen.append(threading.get_ident())
        before = ticks[0]
        started.set()
        time.sleep(0.3)  # blocks its thread, not the loop
        ticks_during.append(ticks[0] - before)
        return 1.0

    async def ticker() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0.01)

    async with ModelServer(compute()) as srv:
        env = vf.SingleTurnEnv(dataset=rows(2), rubric=vf.Rubric(funcs=[slow_reward]))
        t = asyncio.create_task(ticker())
        try:
            out = await env.evaluate(client_for(srv), "m", num_examples=2, rollouts_per_example=1)
        finally:
            t.cancel()
        await env.teardown()
    assert [o["reward"] for o in out["outputs"]] == [1.0, 1.0]
    assert len(seen) == 2 and loop_thread not in seen, (seen, loop_thread)
    # the loop kept ticking while each reward function slept (inline, it would be 0)
    assert all(n > 0 for n in ticks_during), ticks_during


async def test_pool_size_follows_set_concurrency_and_bounds_parallel_calls():
    for size in (3, 1):
        inflight = InFlight()

        def reward(completion) -> float:
            with inflight:
                time.sleep(0.15)
            return 1.0

        async with ModelServer(compute()) as srv:
            env = vf.SingleTurnEnv(dataset=rows(6), rubric=vf.Rubric(funcs=[reward]))
            assert env.sync_pool.size == env.max_workers
            env.set_concurrency(size)
            assert env.sync_pool.size == size
            out = await env.evaluate(client_for(srv), "m", num_examples=3, rollouts_per_example=2, max_concurrent=6)
            await env.teardown()
        assert [o["reward"] for o in out["outputs"]] == [1.0] * 6
        # six rollouts scored at once, but no more than `size` sync calls in parallel
        assert inflight.max == size, (size, inflight.max)
        assert threading.get_ident() not in inflight.threads


async def test_env_group_passes_concurrency_to_its_envs():
    a = vf.SingleTurnEnv(dataset=rows(1))
    b = vf.SingleTurnEnv(dataset=rows(1))
    group = vf.EnvGroup([a, b], env_names=["a", "b"])
    group.set_concurrency(5)
    assert a.sync_pool.size == b.sync_pool.size == group.sync_pool.size == 5


async def test_sync_reward_exceptions_are_reported_as_before(caplog):
    def broken(completion) -> float:
        raise ValueError("bad reward")

    def fine(completion) -> float:
        return 1.0

    async with ModelServer(compute()) as srv:
        env = vf.SingleTurnEnv(dataset=rows(2), rubric=vf.Rubric(funcs=[broken, fine]))
        with caplog.at_level(logging.WARNING):
            out = await env.evaluate(client_for(srv), "m", num_examples=2, rollouts_per_example=1)
        # a raising reward function is the env's error (never a silent 0), traceback kept
        assert all(o["verdict"] == "env" and o["error_type"] == "ScoringError" and o["reward"] == 0.0
                   and "ValueError: bad reward" in o["error_info"]["traceback"] for o in out["outputs"])
        assert out["metadata"]["scored_rollouts"] == 0 and out["metadata"]["errors_by_kind"] == {"env": 2}
        opted = vf.Rubric(funcs=[broken, fine])
        opted.set_exceptions_score_zero()  # explicit opt-in: scores 0, the row says so
        env = vf.SingleTurnEnv(dataset=rows(2), rubric=opted)
        with caplog.at_level(logging.WARNING):
            out = await env.evaluate(client_for(srv), "m", num_examples=2, rollouts_per_example=1)
        await env.teardown()
        assert all(o["reward"] == 1.0 and o["metrics"]["broken"] == 0.0 and o["error"] is None
                   and o["scoring_errors"][0]["function"] == "broken" for o in out["outputs"])
        assert "reward function broken raised ValueError: bad reward (scored 0" in caplog.text

        def infra(completion) -> float:
            raise RuntimeError("wrapped") from vf.InfraError("sandbox died")

        env = vf.SingleTurnEnv(dataset=rows(2), rubric=vf.Rubric(funcs=[infra]))
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=2)
        await env.teardown()
    # an InfraError from a sync reward function still marks the rollouts errored (retryable)
    assert all(o["error_kind"] == "infra" and o["reward"] == 0.0 for o in out["outputs"])


async def test_sync_tool_runs_in_the_pool_async_tool_on_the_loop():
    loop_thread = threading.get_ident()
    where: dict[str, int] = {}

    def add(a: int, b: int) -> int:
        """Add two integers."""
        where["sync"] = threading.get_ident()
        return a + b

    async def add_async(a: int, b: int) -> int:
        """Add two integers."""
        where["async"] = threading.get_ident()
        return a + b

    for tool in (add, add_async):
        async with ModelServer(tool_then_answer(tool.__name__, {"a": 2, "b": 3}, answer="5")) as srv:
            env = vf.ToolEnv(tools=[tool], dataset=rows(1))
            out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=1)
            await env.teardown()
        assert out["outputs"][0]["completion"][1]["content"] == "5"
    assert where["sync"] != loop_thread and where["async"] == loop_thread


async def test_teardown_stops_the_pool_and_it_restarts_on_use():
    env = vf.SingleTurnEnv(dataset=rows(1))
    assert await env.sync_pool.call(threading.get_ident) != threading.get_ident()
    assert env.sync_pool._executor is not None
    await env.teardown()
    assert env.sync_pool._executor is None
    assert await env.sync_pool.call(lambda: 7) == 7  # usable again (a new executor)
    env.sync_pool.shutdown()


async def test_pool_pickles_without_its_threads():
    import copy
    import pickle

    pool = SyncPool(3)
    assert await pool.call(lambda: 1) == 1
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.size == 3 and clone._executor is None and await clone.call(lambda: 2) == 2
    assert copy.deepcopy(pool).size == 3
    pool.shutdown()
    clone.shutdown()


async def test_is_async_callable_and_sync_returning_awaitable():
    import functools

    async def coro(x):
        return x

    class AsyncCall:
        async def __call__(self, x):
            return x

    assert is_async_callable(coro) and is_async_callable(functools.partial(coro, 1)) and is_async_callable(AsyncCall())
    assert not is_async_callable(lambda x: x) and not is_async_callable(print)
    pool = SyncPool(2)
    assert await pool.call(lambda: coro(4)) == 4  # a sync function returning a coroutine: awaited on the loop
    pool.shutdown()


# ----------------------------------------------------------------- measured inline path


def test_a_fast_sync_callable_moves_onto_the_loop_and_a_slow_one_never_does():
    pool = SyncPool(4)
    loop_thread = threading.get_ident()

    def fast() -> int:
        return threading.get_ident()

    def sleepy() -> int:
        time.sleep(0.01)  # blocks: wall time counts, not CPU time
        return threading.get_ident()

    async def main() -> tuple[list[int], list[int]]:
        return [await pool.call(fast) for _ in range(12)], [await pool.call(sleepy) for _ in range(12)]

    fast_threads, sleepy_threads = asyncio.run(main())
    n = SyncPool.inline_after
    assert loop_thread not in fast_threads[:n]  # learned in the pool first
    assert fast_threads[n:] == [loop_thread] * (12 - n)  # then on the loop, no thread hop
    assert loop_thread not in sleepy_threads
    pool.shutdown()


def test_an_inline_callable_that_turns_slow_goes_back_to_the_pool_for_good(caplog):
    pool = SyncPool(2)
    loop_thread = threading.get_ident()
    calls: list[int] = []

    def scorer(slow: bool = False) -> None:
        calls.append(threading.get_ident())
        if slow:
            time.sleep(0.02)

    async def main() -> None:
        for _ in range(SyncPool.inline_after + 1):
            await pool.call(scorer)
        await pool.call(scorer, slow=True)  # on the loop: stalls it once
        for _ in range(2 * SyncPool.inline_after):
            await pool.call(scorer)

    with caplog.at_level(logging.INFO, logger="envs.sync_pool"):
        asyncio.run(main())
    n = SyncPool.inline_after
    assert calls[n] == loop_thread and calls[n + 1] == loop_thread
    assert loop_thread not in calls[n + 2:]  # demoted for good, although fast again
    assert "runs in the thread pool from now on" in caplog.text
    pool.shutdown()


def test_adaptive_off_keeps_every_call_in_the_pool():
    pool = SyncPool(2, adaptive=False)
    loop_thread = threading.get_ident()

    async def main() -> list[int]:
        return [await pool.call(threading.get_ident) for _ in range(3 * SyncPool.inline_after)]

    assert loop_thread not in asyncio.run(main())
    pool.shutdown()
