"""The host agent's re-serialisation of a cell's lines (cells_program.Cell.check), without
Docker: a line the cell's agent wrote in plain form (`plain_line`) is forwarded with the
cell's id prefixed and its bytes otherwise unchanged (no re-encoding of megabytes of
base64); every other accepted line is re-serialised from what was parsed. Either way the
client must read exactly one `cell` key, the channel's, and no key twice: whatever bytes
a hostile cell sends, no reader of the forwarded line can see anything but the checked
message.
"""

from __future__ import annotations

import json
import sys
import random

import pytest

from sandboxes.agent.protocol import b64
from test_agent import _cells_module

CID = 7


@pytest.fixture
def agent():
    return _cells_module()


def _cell(agent, *ids):
    cell = agent["Cell"](CID, None, None)
    for rid in ids:
        cell.expect({"op": "exec", "id": rid, "shell": "true", "limit": 1 << 20})
    return cell


def _pairs(out: bytes) -> list[tuple]:
    """The top-level (key, value) pairs of `out`, duplicates kept."""
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    return json.JSONDecoder(object_pairs_hook=lambda pairs: pairs).decode(out.decode())


def _read_as_checked(out: bytes, line: bytes) -> None:
    """`out` holds the cell key once, first, then exactly the message json read from `line`."""
    keys = [k for k, _ in _pairs(out)]
    assert keys[0] == "cell" and keys.count("cell") == 1, out[:200]
    assert len(set(keys)) == len(keys), f"a key twice in {out[:200]!r}"
    assert json.loads(out) == {"cell": CID, **json.loads(line)}


def _plain(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


HONEST = [
    {"id": 3, "ev": "result", "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False,
     "duration": 0.0012345, "stdout_head": b64(b"hi\n"), "stdout_tail": "", "stdout_dropped": 0,
     "stderr_head": "", "stderr_tail": "", "stderr_dropped": 0},
    {"id": 3, "ev": "result", "exit_code": None, "signal": 9, "timed_out": True, "oom_killed": True,
     "duration": 1.5e-05, "stdout_head": b64(bytes(range(256)) * 4000), "stdout_tail": b64(b"x"),
     "stdout_dropped": 123456789, "stderr_head": ":a-string-that-opens-with-a-colon", "stderr_tail": "",
     "stderr_dropped": 0},
    {"id": 3, "ev": "result", "stdout": "", "stderr": "", "stdout_dropped": 0, "stderr_dropped": 0,
     "stdout_gap": None, "stderr_gap": None, "found": False},
    {"id": 3, "ev": "result", "pid": 4242},
    {"id": 3, "ev": "result"},
    {"id": 3, "ev": "chunk", "stream": "stdout", "data": b64(b"\x00" * 70000)},
]


@pytest.mark.parametrize("msg", HONEST, ids=lambda m: f"{m['ev']}-{len(m)}-keys")
def test_the_agents_replies_are_forwarded_with_the_id_prefixed_and_not_re_encoded(agent, msg):
    line = _plain(msg)
    assert agent["plain_line"](line, json.loads(line))
    out = _cell(agent, 3).check(line)
    assert out == b'{"cell":%d,' % CID + line[1:] + b"\n"
    _read_as_checked(out, line)


def test_a_big_reply_passes_the_framing_and_the_check_intact(agent):
    msg = dict(HONEST[0], stdout_head=b64(random.Random(1).randbytes(1 << 20)))
    line = _plain(msg)
    cell = _cell(agent, 3)
    got = []
    for i in range(0, len(line), 65536):  # as the pump reads it: 64 KiB at a time
        got += cell.lines(line[i:i + 65536])
    got += cell.lines(b"\n")
    assert got == [line]
    _read_as_checked(cell.check(got[0]), line)


# lines json reads as a reply, but not in the agent's plain form: each must be re-serialised
# (or refused), never forwarded as it is
NOT_PLAIN = [
    b'{"id":3,"ev":"result","a":1,"a":"x"}',  # a duplicate key (the last wins in json)
    b'{"id":3,"ev":"result","a":"x","a":1}',
    b'{"id":3,"ev":"result","id":3}',
    b'{"id":3,"ev":"result","a":"\\u0022,\\u0022cell\\u0022:1,\\u0022b\\u0022:\\u0022"}',  # escapes
    b'{"id":3,"ev":"result","a":"x\\"y"}',
    b'{"id":3, "ev":"result"}',  # whitespace
    b'{"id":3,"ev":"result"}\r',
    b'{"id":3,\t"ev":"result"}',
    b' {"id":3,"ev":"result"}',
    b'{"id":3,"ev":"result","a":NaN}',
    b'{"id":3,"ev":"result","a":Infinity}',
    b'{"id":3,"ev":"result","a":1e400}',
    b'{"id":3,"ev":"result","a":123456789012345678901234567890}',
    b'{"id":3,"ev":"result","a":{"cell":1}}',  # nesting
    b'{"id":3,"ev":"result","a":["cell",1]}',
    '{"id":3,"ev":"result","a":"caf\u00e9"}'.encode(),  # not ASCII
    '{"id":3,"ev":"result"}'.encode("utf-16-le"),  # json.loads guesses the encoding of bytes
    '{"id":3,"ev":"result"}'.encode("utf-32"),
]


@pytest.mark.parametrize("line", NOT_PLAIN, ids=range(len(NOT_PLAIN)))
def test_a_line_not_in_plain_form_is_re_serialised(agent, line):
    assert not agent["plain_line"](line, json.loads(line))
    out = _cell(agent, 3).check(line)
    assert out == _plain({"cell": CID, **json.loads(line)}) + b"\n"
    _read_as_checked(out, line)


def test_whatever_a_cell_sends_the_client_reads_only_the_checked_message(agent):
    """Random edits of honest lines (quotes, escapes, spaces, keys, colons, ids cut in):
    each accepted line reads as the checked message with the channel's cell id, once."""
    rng = random.Random(24)
    pieces = [b'"', b"\\", b" ", b":", b",", b'"cell":1,', b'"id":4,', b',"a":"b"', b'"a":', b"\\u0022", b"{", b"}",
              b"1e9", b"-0", b"NaN", b"\xff", b"\xc3\xa9", b"[", b"]", b"null", b'":']
    small = [m for m in HONEST if len(_plain(m)) < 1000]
    base = [_plain(m) for m in small] + [_plain({"id": 3, "ev": "result", "a": "b", "c": 1})]
    accepted = 0
    for _ in range(20000):
        line = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(line) + 1)
            if rng.random() < 0.3 and at < len(line):
                del line[at:at + rng.randint(1, 4)]
            else:
                line[at:at] = rng.choice(pieces)
        line = bytes(line)
        cell = _cell(agent, 3, 4)
        try:
            out = cell.check(line)
        except agent["CellViolation"]:
            continue
        accepted += 1
        _read_as_checked(out, line)
    assert accepted > 1000  # the edits do produce lines the host accepts (the property was exercised)


def test_a_flood_of_tiny_pieces_is_bounded_like_a_flood_of_bytes(agent):
    """A line that comes one byte per read is held as pieces: each piece is charged more
    than it costs, so the host holds no more than the line limit however the line is cut."""
    cell = _cell(agent)
    with pytest.raises(agent["CellViolation"], match="a line over"):
        for _ in range(10**6):
            cell.lines(b"x")
    held = len(cell.buf.parts)
    assert 10_000 < held < cell.max_line // 64
    assert held * (sys.getsizeof(b"x") + 8) <= cell.max_line  # the bytes objects and the list's slots
    assert cell.lines(b"\n") == [b"x" * held]  # what was held is the line's start, once
