"""vf-sandbox sandboxes inside other agent frameworks, one module each:

* `integrations.inspect_vf` — inspect_ai's sandbox provider "vf" (registered through
  inspect's `inspect_ai` entry point: `sandbox=("vf", VfSandboxConfig(...))`).
* `integrations.miniswe` — mini-swe-agent's environment (`VfEnvironment`, loaded by
  import path: `environment_class: integrations.miniswe.VfEnvironment`).

They use only the `sandboxes` contract; backends are found by name (`get_backend`),
as envs do. docs/frameworks.md says how to select each one.
"""
