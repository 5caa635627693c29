"""Demo: one sandbox end to end on the default backend (Docker): create it from
the default spec, run commands, move a file in and out, show the limits it
really runs under, delete it. Run: .venv/bin/python scripts/demo_sandbox.py"""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.table import Table

from sandboxes import SandboxSpec, get_backend

console = Console()


async def main() -> None:
    backend = get_backend()
    spec = SandboxSpec(name="demo", cpu_cores=1, memory_gb=0.5, timeout_minutes=5)
    try:
        async with await backend.create(spec) as sb:
            console.print(f"created [bold]{sb.name}[/] ({sb.id[:12]}) from {spec.image} on {backend.name}")
            table = Table("command", "exit", "ms", "output")
            for cmd in [
                "python3 -c 'import sys; print(sys.version.split()[0])'",
                "id -u; cat /proc/self/status | grep -E 'CapEff|NoNewPrivs'",
                "ls /sys/class/net",
                "sleep 5",
                "exit 3",
            ]:
                r = await sb.exec(cmd, timeout=1)
                out = (r.output.strip() or ("(timed out)" if r.timed_out else "")).replace("\n", " | ")
                table.add_row(cmd, str(r.exit_code), f"{r.duration * 1000:.1f}", out)
            console.print(table)
            await sb.write_file("/tmp/hello.txt", "hello from the host\n")
            data = await sb.read_file("/tmp/hello.txt")
            console.print(f"file round trip: {data!r}")
        console.print("sandbox deleted; left behind:", len(await backend.list({"vf-sandbox.run-id": _run_id()})))
    finally:
        await backend.close()


def _run_id() -> str:
    from sandboxes.labels import run_id

    return run_id()


if __name__ == "__main__":
    asyncio.run(main())
