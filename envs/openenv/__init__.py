"""OpenEnv projects in vf-sandbox sandboxes.

    manifest.py        openenv.yaml and the .build.json manifest
    contract.py        gym vs mcp: from the app's source (AST) and from /schema
    build.py           offline, content-hashed image build (base image + host wheelhouse)
    relay_program.py   the stdlib-only relay run inside the sandbox
    forwarder.py       host side of the relay (Forwarder) and DirectTransport
    session.py         the OpenEnv /ws session protocol (reset/step/state, list_tools/call_tool)
    actions.py         assistant text -> action; MCP tools/results <-> model form
    env.py             OpenEnvEnv(MultiTurnEnv)

Nothing here is imported by `import envs` until `OpenEnvEnv` is asked for. The command
`vf-sandbox openenv build PROJECT` is `vfcli.openenv_cmd`.
"""
