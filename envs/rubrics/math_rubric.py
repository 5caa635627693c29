"""`MathRubric`: reward 1 when the model's last `\\boxed{}` answer is
mathematically equivalent to the reference answer (`x + 1` = `1 + x`,
`\\frac{1}{2}` = `0.5`), decided by math-verify, as the reference does.

math-verify bounds its own parse / verify time with `signal.alarm`, which
only works in a process's main thread; so each check runs in a small process
pool (`verify_response`, in the worker's main thread, with those timeouts),
never on the event loop or in a thread. A check that takes longer than
`timeout_seconds` scores 0; one that hangs past `HARD_TIMEOUT_SECONDS` scores
0 and its worker processes are killed and replaced. The pool starts on the
first check (a rubric that is built and never used starts nothing), is
dropped when the rubric is pickled (env workers build their own), and is shut
down by `teardown()`. The default parser is the reference's: MaybeThinkParser
over the strict last `\\boxed{}`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

from ..parsers import MaybeThinkParser, Parser
from ..types import Messages, RewardFunc
from ..utils import extract_boxed_answer
from .rubric import Rubric

log = logging.getLogger(__name__)


def parse(*args: Any, **kwargs: Any) -> Any:
    """math_verify.parse, imported on first use (sympy takes seconds to import, so
    `import envs` must not pay for it)."""
    from math_verify import parse as _parse

    return _parse(*args, **kwargs)


def verify(*args: Any, **kwargs: Any) -> Any:
    """math_verify.verify, imported on first use."""
    from math_verify import verify as _verify

    return _verify(*args, **kwargs)


def _is_math_verify_timeout(exc: BaseException) -> bool:
    from math_verify.errors import TimeoutException

    return isinstance(exc, TimeoutException)


def verify_response(response: str, answer: str, max_verify_chars: int,
                    timeout_seconds: int = 5) -> tuple[float, float]:
    """(1.0 or 0.0, seconds taken): math-verify's verdict on `response` against
    `answer`, both read as `\\boxed{...}`. Runs in a pool worker's main thread (its
    timeouts use SIGALRM); a math-verify timeout or error scores 0, while
    cancellation and interrupts propagate."""
    start = time.perf_counter()
    if response == "" or len(response) > max_verify_chars:
        return 0.0, time.perf_counter() - start
    try:
        gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout_seconds)
        pred = parse(f"\\boxed{{{response}}}", parsing_timeout=timeout_seconds)
        ok = verify(gold, pred, timeout_seconds=timeout_seconds)
    except Exception:
        return 0.0, time.perf_counter() - start
    except BaseException as exc:  # math-verify's timeout is a BaseException; cancellation is not ours
        if _is_math_verify_timeout(exc):
            return 0.0, time.perf_counter() - start
        raise
    return float(ok), time.perf_counter() - start


class MathRubric(Rubric):
    """One reward function, `correct_answer` (see the module docstring)."""

    HARD_TIMEOUT_SECONDS: float = 120.0
    MAX_VERIFY_CHARS: int = 50_000

    def __init__(
        self,
        funcs: list[RewardFunc] | None = None,
        weights: list[float] | None = None,
        parser: Parser | None = None,
        max_workers: int = 8,
        timeout_seconds: float = 5,
        max_verify_chars: int = MAX_VERIFY_CHARS,
    ):
        parser = parser or MaybeThinkParser(extract_fn=partial(extract_boxed_answer, strict=True))
        super().__init__(funcs=funcs, weights=weights, parser=parser)
        self.add_reward_func(self.correct_answer)
        self.max_workers = max(1, min(int(max_workers), os.cpu_count() or 1))
        self.timeout_seconds = timeout_seconds
        self.max_verify_chars = max_verify_chars
        self._executor: ProcessPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_executor"] = None  # processes do not travel; the copy starts its own on first use
        return state

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # forkserver: never fork the threaded parent (event loop, thread pools); the server
            # imports math-verify once, so each worker (of any MathRubric) starts warm
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([__name__, "math_verify"])
            self._executor = ProcessPoolExecutor(max_workers=self.max_workers, mp_context=ctx)
        return self._executor

    async def correct_answer(self, parser: Parser, completion: Messages, answer: str, **kwargs: Any) -> float:
        """1.0 when the parsed answer is equivalent to `answer` within the time limit."""
        response = parser.parse_answer(completion) or ""
        if len(response) > self.max_verify_chars:
            log.warning("math verification skipped: the parsed answer is %d chars (> %d)", len(response),
                        self.max_verify_chars)
            return 0.0
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.HARD_TIMEOUT_SECONDS):
                reward, elapsed = await loop.run_in_executor(self._pool(), verify_response, response, str(answer),
                                                             self.max_verify_chars, int(self.timeout_seconds))
        except asyncio.TimeoutError:
            log.warning("math verification hung past %.0fs (answer %r): its workers are replaced",
                        self.HARD_TIMEOUT_SECONDS, response[:200])
            self._kill_pool()
            return 0.0
        if elapsed > self.timeout_seconds:
            log.debug("math verification took %.2fs (> %.1fs): scored 0", elapsed, self.timeout_seconds)
            return 0.0
        return reward

    def _kill_pool(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        procs = list((getattr(executor, "_processes", None) or {}).values())
        for p in procs:
            p.kill()
        for p in procs:
            p.join(timeout=5)
        executor.shutdown(wait=False, cancel_futures=True)

    async def teardown(self) -> None:
        await super().teardown()
        self._kill_pool()
