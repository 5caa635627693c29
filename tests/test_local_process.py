"""`LocalProcess` (the BackgroundProcess contract over a host subprocess, used by
the tool sessions' host-side tests) reports dropped output like the agent does."""

from __future__ import annotations

import sys

import pytest

from envs.sandbox_tools.local_process import LocalProcess


async def test_overflow_is_counted_per_read_and_in_total():
    code = "import sys; sys.stdout.write('a' * 5000 + 'END'); sys.stderr.write('e' * 3000); sys.stdout.flush()"
    proc = await LocalProcess.start([sys.executable, "-c", code], buffer_limit=1024)
    try:
        await proc.wait(10)
        out, err = await proc.read_output()
        assert out.endswith("END") and len(out) == 1024  # the newest bytes are kept
        assert len(err) == 1024
        assert proc.dropped_bytes == (5003 - 1024, 3000 - 1024)
        assert proc.total_dropped_bytes == proc.dropped_bytes
        out, err = await proc.read_output()
        assert (out, err) == ("", "") and proc.dropped_bytes == (0, 0)
        assert proc.total_dropped_bytes == (5003 - 1024, 3000 - 1024)
    finally:
        await proc.kill()


async def test_unknown_keep_is_refused_before_anything_starts():
    from sandboxes.errors import ConfigError

    with pytest.raises(ConfigError, match="keep must be"):
        await LocalProcess.start(["true"], keep="oldest")
