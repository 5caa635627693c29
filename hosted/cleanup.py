"""`python -m hosted.cleanup LABEL BACKEND OPTIONS_JSON`: a Ray job
(submitted by `vf-sandbox runs stop`) that deletes every sandbox carrying the
run-id label LABEL on every alive node of the cluster: one task per node,
pinned there, each using that node's backend. Prints `removed N on NODE` per
node."""

from __future__ import annotations

import asyncio
import json
import sys


def _delete_here(label: str, backend: str, options: dict) -> tuple[str, int]:
    import socket

    from sandboxes.lifecycle import delete_run_sandboxes

    return socket.gethostname(), asyncio.run(delete_run_sandboxes(backend, options, label))


def main(argv: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    label, backend = argv[0], argv[1]
    options = json.loads(argv[2]) if len(argv) > 2 else {}
    ray.init(log_to_driver=False)
    task = ray.remote(num_cpus=0, max_retries=0)(_delete_here)
    refs = {n["NodeID"]: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(label, backend, options) for n in ray.nodes() if n.get("Alive")}
    status = 0
    for node, ref in refs.items():
        try:
            host, n = ray.get(ref, timeout=120)
            print(f"removed {n} on {host} ({node[:12]})", flush=True)
        except Exception as exc:  # noqa: BLE001 - report every node
            print(f"error: node {node[:12]}: {exc}", flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
