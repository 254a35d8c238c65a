"""The broker's end of a sandbox channel refuses oversize and malformed frames."""

import socket
import struct

import pytest

from fleet_sandbox_broker.errors import ProtocolViolation, TooLarge
from fleet_sandbox_broker.providers import frames


async def read_all(raw: bytes, limit: int = 1024) -> list[object]:
    mine, theirs = socket.socketpair()
    channel = frames.Channel(mine, limit)
    theirs.sendall(raw)
    theirs.close()
    try:
        return [frame async for frame in channel.frames()]
    finally:
        channel.close()


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def test_valid_frames_decode_in_order() -> None:
    got = await read_all(frame(b'{"t":"ready","pid":7}') + frame(b'{"t":"ok","req":"r1"}'))
    assert got == [frames.Ready(pid=7), frames.Ok(req="r1")]


async def test_a_length_over_the_limit_is_refused_before_reading_the_body() -> None:
    with pytest.raises(TooLarge, match="frame of 2000 bytes, over the 1024-byte limit"):
        await read_all(struct.pack(">I", 2000))


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"t":"bogus"}', b'{"t":"ready"}', b'{"t":"ready","pid":"x"}', b"[]"],
)
async def test_malformed_or_unknown_frames_are_protocol_violations(body: bytes) -> None:
    with pytest.raises(ProtocolViolation, match="malformed frame"):
        await read_all(frame(body))
