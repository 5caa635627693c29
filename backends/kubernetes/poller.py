"""Coalesced pod status reads while sandboxes start.

Hundreds of creations each polling their own pod would send hundreds of GETs
per second to the API server. Instead, status reads that arrive within a
short window (25 ms, like the prime SDK's status batcher) share one request
per run label: a GET when only one pod is asked for, otherwise one LIST
filtered by the pods' run label (`vf-sandbox.run-id`), which covers every pod
of that run this process is waiting on. The label is each read's own (a
backend serves every run its process starts, one after another or at once).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .api import KubeApi


class StatusBatcher:
    """`await batcher.get(name, selector)` → the pod (dict) or None when it does not exist;
    `selector` is a label selector that matches the pod (its run label)."""

    def __init__(self, api: KubeApi, window: float = 0.025) -> None:
        self.api = api
        self.window = window
        self._pending: dict[str, dict[str, asyncio.Future]] | None = None  # selector -> pod name -> waiter
        self.lists = 0  # LIST requests made (for tests and curiosity)
        self.gets = 0

    async def get(self, name: str, selector: str) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        if self._pending is None:
            self._pending = {}
            loop.call_later(self.window, self._fire)
        batch = self._pending.setdefault(selector, {})
        fut = batch.get(name)
        if fut is None:
            fut = batch[name] = loop.create_future()
        return await asyncio.shield(fut)

    def _fire(self) -> None:
        pending, self._pending = self._pending or {}, None
        for selector, batch in pending.items():
            asyncio.ensure_future(self._fetch(selector, batch))

    async def _fetch(self, selector: str, pending: dict[str, asyncio.Future]) -> None:
        try:
            if len(pending) == 1:
                (name,) = pending
                self.gets += 1
                found = {name: await self.api.get_pod(name)}
            else:
                self.lists += 1
                pods = await self.api.list_pods(selector)
                by_name = {(p.get("metadata") or {}).get("name"): p for p in pods}
                found = {n: by_name.get(n) for n in pending}
        except BaseException as e:  # every waiter of this batch sees the failure
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(e)
                    fut.exception()  # retrieved here; awaiting it still raises
            if not isinstance(e, Exception):
                raise
            return
        for n, fut in pending.items():
            if not fut.done():
                fut.set_result(found[n])
