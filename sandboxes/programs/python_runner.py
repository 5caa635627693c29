"""Runs INSIDE a sandbox (stdlib only): one v1 Python program (`{"fn": ...}` or a
module-level callable) for one rollout.

    python3 python_runner.py SPEC.json RESULT.json

(A SPEC with "kwargs" is one tool call of a sandboxed toolset instead:
{"ref", "kwargs", "requires"} -> RESULT {"value", "error", "missing"}.)

SPEC: {"ref": "pkg.module:attr", "task": {...}, "state": {...}, "endpoint":
{"base_url", "api_key", "model"}, "max_turns": int, "requires": [dist, ...]}.
The program gets the task (a read-only dict) and a `State` with the v1
methods a program uses: `stop`, `get_model`, `get_endpoint_config`,
`get_client` (the `openai` SDK when the image has it, else a small stdlib
client with the same `chat.completions.create` shape), `get_tools` (the
rollout's tools, run on the host through the endpoint's tool routes),
`get_max_turns`.
Its model calls reach the host's interception endpoint through the relay
(OPENAI_BASE_URL is the relay's loopback address: the network stays off).

RESULT: {"fields": {...}, "stop": condition | null, "error": {"type",
"message", "traceback"} | null, "missing": [dist, ...]}: the program's state
fields (the host merges them), its stop, what it raised, and required
distributions absent from the image (the program is not run then).
"""

import asyncio
import importlib
import inspect
import json
import sys
import traceback
import urllib.error
import urllib.request

MANAGED = frozenset({"is_completed", "stop_condition", "is_truncated", "error"})


class ModelCallError(Exception):
    """The endpoint answered a model call with an HTTP error (the stdlib client's
    counterpart of openai.APIStatusError)."""

    def __init__(self, status, body):
        super().__init__("model call failed with HTTP %s: %s" % (status, body[:500]))
        self.status_code = status
        self.body = body


class _Obj(dict):
    """A JSON object with attribute access (`resp.choices[0].message.content`)."""

    def __getattr__(self, name):
        try:
            return _wrap(self[name])
        except KeyError:
            if name in ("content", "tool_calls", "refusal", "reasoning_content", "usage"):
                return None
            raise AttributeError(name) from None

    def __getitem__(self, key):
        return _wrap(dict.__getitem__(self, key))

    def model_dump(self):
        return json.loads(json.dumps(self))


def _wrap(value):
    if isinstance(value, dict) and not isinstance(value, _Obj):
        return _Obj(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class _Completions:
    def __init__(self, endpoint, is_async):
        self._endpoint = endpoint
        self._async = is_async

    def _post(self, body):
        data = json.dumps(body).encode()
        req = urllib.request.Request(self._endpoint["base_url"].rstrip("/") + "/chat/completions", data=data,
                                     headers={"Authorization": "Bearer " + self._endpoint["api_key"],
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as resp:
                return _wrap(json.load(resp))
        except urllib.error.HTTPError as exc:
            raise ModelCallError(exc.code, exc.read().decode("utf-8", "replace")) from None

    def create(self, **kwargs):
        body = {k: v for k, v in kwargs.items() if v is not None}
        body.setdefault("model", self._endpoint["model"])
        if self._async:
            return asyncio.to_thread(self._post, body)
        return self._post(body)


class _Chat:
    def __init__(self, endpoint, is_async):
        self.completions = _Completions(endpoint, is_async)


class MiniClient:
    """`client.chat.completions.create(...)` over urllib (awaitable when async)."""

    def __init__(self, endpoint, is_async):
        self.chat = _Chat(endpoint, is_async)

    def close(self):
        return None


class State(dict):
    """The in-sandbox view of a v1 State (see the module docstring)."""

    def __init__(self, data, endpoint, task, max_turns):
        super().__init__(data)
        self._endpoint = endpoint
        self._task = task
        self._max_turns = max_turns
        self._stop = None
        self._clients = {}

    def __setitem__(self, key, value):
        if key in MANAGED:
            raise RuntimeError("state[%r] is managed by the framework: use state.stop(...) or raise" % key)
        dict.__setitem__(self, key, value)

    def update(self, *args, **kwargs):
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def stop(self, condition="state_done"):
        self._stop = condition

    def get_model(self):
        return self._endpoint["model"]

    def get_endpoint_config(self, api="chat_completions"):
        apis = ("chat_completions", "responses", "anthropic_messages")
        if api not in apis:
            raise RuntimeError("api %r is not served by the v1 endpoint; supported: %s" % (api, list(apis)))
        cfg = dict(self._endpoint)
        if api == "anthropic_messages" and cfg["base_url"].endswith("/v1"):
            cfg["base_url"] = cfg["base_url"][:-3]
        return cfg

    def get_client(self, api="chat_completions", sync=False):
        cfg = self.get_endpoint_config(api)
        key = (api, sync)
        if key not in self._clients:
            sdk = "anthropic" if api == "anthropic_messages" else "openai"
            try:
                module = importlib.import_module(sdk)
            except ImportError:
                if api != "chat_completions":
                    raise RuntimeError("the %s api needs the %s package in the sandbox image" % (api, sdk)) from None
                self._clients[key] = MiniClient(cfg, is_async=not sync)
            else:
                names = ("Anthropic", "AsyncAnthropic") if sdk == "anthropic" else ("OpenAI", "AsyncOpenAI")
                cls = getattr(module, names[0] if sync else names[1])
                self._clients[key] = cls(base_url=cfg["base_url"], api_key=cfg["api_key"], max_retries=0)
        return self._clients[key]

    def _http(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._endpoint["base_url"].rstrip("/") + path, data=data, method=method,
                                     headers={"Authorization": "Bearer " + self._endpoint["api_key"],
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            raise RuntimeError("tool endpoint answered HTTP %s: %s" % (exc.code, exc.read()[:500])) from None

    def get_tools(self):
        """The rollout's tools, run on the host through the endpoint: {name: async fn(**kwargs)}."""
        tools = {}
        for spec in self._http("GET", "/vf/tools")["tools"]:
            tools[spec["name"]] = self._tool(spec["name"])
        return tools

    def _tool(self, name):
        async def call(**kwargs):
            out = await asyncio.to_thread(self._http, "POST", "/vf/tools/" + name, kwargs)
            if out.get("error"):
                raise RuntimeError(out["error"])
            return out.get("content")

        call.__name__ = name
        return call

    def get_max_turns(self, default):
        value = self._task.get("max_turns")
        return int(value) if value is not None else int(default)


def missing_distributions(names):
    from importlib import metadata

    missing = []
    for name in names:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _resolve(ref):
    module, _, attr = ref.partition(":")
    fn = importlib.import_module(module)
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn


def _error(exc):
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()[-8000:]}


def call_tool(spec):
    """A sandboxed toolset's tool: fn(**kwargs) -> {"value", "error", "missing"}."""
    result = {"value": None, "error": None, "missing": missing_distributions(spec.get("requires") or [])}
    if not result["missing"]:
        try:
            value = _resolve(spec["ref"])(**spec["kwargs"])
            if inspect.isawaitable(value):
                async def _await(aw):
                    return await aw

                value = asyncio.run(_await(value))
            result["value"] = value
        except BaseException as exc:
            result["error"] = _error(exc)
    return result


def main(spec_path, result_path):
    with open(spec_path) as f:
        spec = json.load(f)
    if "kwargs" in spec:
        with open(result_path, "w") as f:
            json.dump(call_tool(spec), f, default=repr)
        return
    result = {"fields": {}, "stop": None, "error": None, "missing": missing_distributions(spec.get("requires") or [])}
    if not result["missing"]:
        state = State(spec["state"], spec["endpoint"], spec["task"], spec.get("max_turns") or 10)
        try:
            out = _resolve(spec["ref"])(spec["task"], state)
            if inspect.isawaitable(out):
                async def _await(aw):
                    return await aw

                asyncio.run(_await(out))
        except BaseException as exc:  # reported to the host, which records it on the rollout
            result["error"] = _error(exc)
        for client in state._clients.values():
            try:
                closing = client.close()
                if inspect.isawaitable(closing):  # openai.AsyncOpenAI
                    asyncio.run(closing)
            except Exception:
                pass
        result["fields"] = dict(state)
        result["stop"] = state._stop
    with open(result_path, "w") as f:
        json.dump(result, f, default=repr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
