"""OpenEnv projects in vf-sandbox sandboxes.

    manifest.py        openenv.yaml and the .build.json manifest
    contract.py        gym vs mcp: from the app's source (AST) and from /schema
    build.py           offline, content-hashed image build (base image + host wheelhouse)
    forwarder.py       host side of the relay (Forwarder) and DirectTransport; the relay
                       itself, run inside the sandbox, is sandboxes/programs/relay.py
    session.py         the OpenEnv /ws session protocol (reset/step/state, list_tools/call_tool)
    actions.py         assistant text -> action; MCP tools/results <-> model form
    env.py             OpenEnvEnv(MultiTurnEnv)

Nothing here is imported by `import envs` until `OpenEnvEnv` is asked for. The command
`vf-sandbox openenv build PROJECT` is `vfcli.openenv_cmd`.
"""
