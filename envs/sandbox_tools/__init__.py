"""Programs that run INSIDE a sandbox for the sandbox tool environments, and
their host-side drivers.

In the sandbox (stdlib only, shipped as source and started with `python3 -c`):
  repl_worker.py  the persistent Python interpreter (one namespace across cells)
(the persistent shell is bash itself: the agent's buffer keeps each command's head and tail)

On the host (over `Sandbox.start_process`: stdin writes and marker-waited reads,
one round trip per call):
  shell_session.py  `ShellSession` — persistent bash driven directly (`SandboxEnv.bash`)
  repl_session.py   `ReplSession` — the Python worker (`PythonEnv.python`)
  local_process.py  `LocalProcess`: the same contract over a host subprocess (tests, benchmarks)
"""
