"""The host-side drivers of the sandbox tool environments' programs, which run
INSIDE a sandbox.

In the sandbox (stdlib only, shipped as source and started with `python3 -c`;
`sandboxes/programs/`, with every other in-sandbox program):
  repl_worker.py  the persistent Python interpreter (one namespace across cells),
                  `prelude.py` (here) in front of it
(the persistent shell is bash itself: the agent's buffer keeps each command's head and tail)

On the host (over `Sandbox.start_process`: stdin writes and marker-waited reads,
one round trip per call):
  shell_session.py  `ShellSession` — persistent bash driven directly (`SandboxEnv.bash`)
  repl_session.py   `ReplSession` — the Python worker (`PythonEnv.python`)
  local_process.py  `LocalProcess`: the same contract over a host subprocess (tests, benchmarks)
"""
