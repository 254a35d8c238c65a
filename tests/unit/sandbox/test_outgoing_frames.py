"""What the broker sends reaches the runner as the JSON objects it reads: the broker's typed
requests (frames.Request) on one end of a socketpair, the runner's own Channel on the other."""

import socket
from typing import Any

import pytest

from fleet_sandbox_broker.providers import frames, runner

REQUESTS: list[tuple[frames.Request, dict[str, Any]]] = [
    (
        frames.Init(limits={"RLIMIT_AS": 1}, cell_cpu_s=2, checkpoints=False, output_cap=3,
                    max_frame=4, max_in=5),
        {"t": "init", "limits": {"RLIMIT_AS": 1}, "cell_cpu_s": 2, "checkpoints": False,
         "output_cap": 3, "max_frame": 4, "max_in": 5},
    ),
    (
        frames.Exec(exec="e1", ctx="main", code="1", vars={"x": "h"}, blobs={"h": "1"},
                    tools=["t"], output_fields=None),
        {"t": "exec", "exec": "e1", "ctx": "main", "code": "1", "vars": {"x": "h"},
         "blobs": {"h": "1"}, "tools": ["t"], "output_fields": None, "stream": False},
    ),
    (
        frames.ToolResult(id=7, ok=False, error="no"),
        {"t": "tool_result", "id": 7, "ok": False, "value": None, "error": "no"},
    ),
    (frames.Open(ctx="c", req="r"), {"t": "open", "ctx": "c", "req": "r"}),
    (frames.Close(ctx="c", req="r"), {"t": "close", "ctx": "c", "req": "r"}),
    (frames.Interrupt(exec="e1", ctx="c", req="r"),
     {"t": "interrupt", "exec": "e1", "ctx": "c", "req": "r"}),
    (frames.Fork(fork="f", cwd="/w", env={"A": "b"}),
     {"t": "fork", "fork": "f", "cwd": "/w", "env": {"A": "b"}}),
]  # fmt: skip


@pytest.mark.parametrize(("request_frame", "seen"), REQUESTS, ids=lambda v: type(v).__name__)
async def test_each_request_is_the_object_the_runner_reads(
    request_frame: frames.Request, seen: dict[str, Any]
) -> None:
    mine, theirs = socket.socketpair()
    channel = frames.Channel(mine, 1 << 20)
    inbox = runner.Channel(theirs, 1 << 20)
    try:
        await channel.send(request_frame)
        assert inbox.read()
        assert inbox.frames() == [seen]
    finally:
        channel.close()
        theirs.close()


def test_every_request_kind_is_one_the_runner_handles() -> None:
    handled = {"exec", "tool_result", "open", "close", "fork", "interrupt", "init", "exit"}
    sent = {seen["t"] for _, seen in REQUESTS}
    assert sent <= handled
    assert {cls.__struct_config__.tag for cls in frames.Request.__subclasses__()} == sent
