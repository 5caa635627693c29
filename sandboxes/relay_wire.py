"""The host side of the one relay wire format (`sandboxes/programs/relay.py`, whose
docstring defines it): a message is one compact JSON object with an "id"; the host
writes each as one line, the relay answers with frames `<JSON line>\\n@@vfr-end-ID@@\\n`.
Used by both directions: OpenEnv's forwarder (the host asks, the relay answers) and
the v1 sandbox relay (the relay asks for a program in the sandbox, the host answers)."""

from __future__ import annotations

import json
import re
from typing import Any

_MARKER = re.compile(r"\n@@vfr-end-([A-Za-z0-9_-]{1,64})@@\n")


class WireError(ValueError):
    """A frame that is not a JSON object of the wire format."""


def marker(rid: Any) -> str:
    """The end marker of the frame answering or carrying message `rid`."""
    return f"\n@@vfr-end-{rid}@@\n"


def line(msg: dict[str, Any]) -> bytes:
    """One message as the host writes it: compact JSON, one line (ASCII)."""
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode("ascii")


def message(frame: str, rid: Any = None) -> dict[str, Any]:
    """The message of one frame (text ending with its marker; anything before the
    JSON line is skipped). `rid`: the id it must carry. Raises WireError."""
    text = frame[: frame.rfind("\n@@vfr-end-")] if "\n@@vfr-end-" in frame else frame
    text = text[text.rfind("\n") + 1:]
    try:
        msg = json.loads(text)
    except ValueError:
        raise WireError(f"not a relay frame: {text[:200]!r}") from None
    if not isinstance(msg, dict):
        raise WireError(f"not a relay message: {text[:200]!r}")
    if rid is not None and msg.get("id") != rid:
        raise WireError(f"an answer to message {msg.get('id')!r} where {rid!r} was awaited")
    return msg


def split_frames(buf: str) -> tuple[list[dict[str, Any]], str]:
    """The complete frames at the start of `buf` as messages, and the text left over
    (an incomplete frame). A frame whose marker does not match its message's id is a
    WireError."""
    out: list[dict[str, Any]] = []
    while True:
        m = _MARKER.search(buf)
        if m is None:
            return out, buf
        msg = message(buf[: m.end()])
        if str(msg.get("id")) != m.group(1):
            raise WireError(f"frame of message {msg.get('id')!r} closed by the marker of {m.group(1)!r}")
        out.append(msg)
        buf = buf[m.end():]
