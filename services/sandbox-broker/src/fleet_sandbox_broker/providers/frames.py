"""Frames between the broker and a local sandbox's runner, and the broker's end of the channel.

Everything the runner sends is untrusted: a frame is refused before it is read if its length
prefix is over the limit, and must decode into one of these Structs or the sandbox is stopped.
Who sent it is known from the socket it came on, never from what it says.
"""

import array
import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any, Union

import msgspec

from fleet_sandbox_broker.errors import ProtocolViolation, TooLarge

HEADER = struct.Struct(">I")
CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
CREDENTIALS_SPACE = socket.CMSG_SPACE(CREDENTIALS.size)


def _set_done(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="t"):
    pass


class Ready(Frame, frozen=True, kw_only=True, tag="ready"):
    pid: int


class Ok(Frame, frozen=True, kw_only=True, tag="ok"):
    req: str


class Result(Frame, frozen=True, kw_only=True, tag="result"):
    exec: str
    value: Any = None
    stdout: str = ""


class Final(Frame, frozen=True, kw_only=True, tag="final"):
    exec: str
    value: Any = None
    stdout: str = ""


class SyntaxFailure(Frame, frozen=True, kw_only=True, tag="syntax"):
    exec: str
    error: str
    stdout: str = ""


class ExecFailure(Frame, frozen=True, kw_only=True, tag="error"):
    exec: str
    error: str
    stdout: str = ""


class Missing(Frame, frozen=True, kw_only=True, tag="missing"):
    exec: str
    hashes: list[str]


class Fatal(Frame, frozen=True, kw_only=True, tag="fatal"):
    kind: str
    error: str
    exec: str | None = None
    stdout: str = ""


class ToolRequest(Frame, frozen=True, kw_only=True, tag="tool"):
    id: int
    exec: str
    name: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class Output(Frame, frozen=True, kw_only=True, tag="out"):
    """What a streaming cell printed since its last `out` frame (a preview: the answer
    carries all of it)."""

    exec: str
    text: str


class Forked(Frame, frozen=True, kw_only=True, tag="forked"):
    fork: str


class ForkRefused(Frame, frozen=True, kw_only=True, tag="fork_failed"):
    fork: str
    error: str


# -- broker -> runner ---------------------------------------------------------------------


class Request(msgspec.Struct, frozen=True, kw_only=True, tag_field="t"):
    """What the broker sends; the runner (stdlib only) reads these as plain JSON objects."""


class Init(Request, frozen=True, kw_only=True, tag="init"):
    limits: dict[str, int]
    cell_cpu_s: int
    checkpoints: bool
    output_cap: int
    max_frame: int
    max_in: int


class Exec(Request, frozen=True, kw_only=True, tag="exec"):
    exec: str
    ctx: str
    code: str
    vars: dict[str, str]
    blobs: dict[str, str]
    tools: list[str]
    output_fields: list[dict[str, Any]] | None
    stream: bool = False
    """Send what the cell prints as `out` frames while it runs."""


class ToolResult(Request, frozen=True, kw_only=True, tag="tool_result"):
    id: int
    ok: bool
    value: Any = None
    error: str = ""


class Open(Request, frozen=True, kw_only=True, tag="open"):
    ctx: str
    req: str


class Close(Request, frozen=True, kw_only=True, tag="close"):
    ctx: str
    req: str


class Fork(Request, frozen=True, kw_only=True, tag="fork"):
    """Sent with the child's socket in SCM_RIGHTS."""

    fork: str
    cwd: str
    env: dict[str, str]


class Interrupt(Request, frozen=True, kw_only=True, tag="interrupt"):
    exec: str
    ctx: str
    req: str


# -- runner -> broker ---------------------------------------------------------------------


class Interrupted(Frame, frozen=True, kw_only=True, tag="interrupted"):
    """`running`: the execution was still running when the interrupt reached the runner."""

    req: str
    running: bool


AnyFrame = Union[  # noqa: UP007 - msgspec needs a runtime union
    Interrupted,
    Ready,
    Ok,
    Result,
    Final,
    SyntaxFailure,
    ExecFailure,
    Missing,
    Fatal,
    ToolRequest,
    Output,
    Forked,
    ForkRefused,
]
ExecOutcome = Result | Final | SyntaxFailure | ExecFailure | Missing

_decoder: msgspec.json.Decoder[AnyFrame] = msgspec.json.Decoder(AnyFrame)
_encoder = msgspec.json.Encoder()


class Channel:
    """The broker's end of one sandbox socket (non-blocking, on the running loop)."""

    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        sock.setblocking(False)
        # the kernel attaches the sender's pid to what it reads, translated into this
        # process's pid namespace: a sandbox's own getpid() is its namespace's number
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock = sock
        self.max_frame = max_frame
        self.peer_pid: int | None = None  # who sent the last bytes read, as the host names it
        self._buf = bytearray()
        self._send_lock = asyncio.Lock()

    async def send(self, message: Request, fds: tuple[int, ...] = ()) -> None:
        body = _encoder.encode(message)
        frame = HEADER.pack(len(body)) + body
        loop = asyncio.get_running_loop()
        async with self._send_lock:
            if fds:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                while True:
                    try:
                        sent = self.sock.sendmsg([frame], rights)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(0.001)
                frame = frame[sent:]
            if frame:
                await loop.sock_sendall(self.sock, frame)

    async def frames(self) -> AsyncIterator[Any]:
        """Decoded frames until the sandbox closes its end."""
        loop = asyncio.get_running_loop()
        while True:
            while len(self._buf) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buf)
                if size > self.max_frame:
                    raise TooLarge(
                        f"the sandbox sent a frame of {size} bytes, over the {self.max_frame}-byte "
                        "limit"
                    )
                if len(self._buf) < HEADER.size + size:
                    break
                body = bytes(self._buf[HEADER.size : HEADER.size + size])
                del self._buf[: HEADER.size + size]
                try:
                    yield _decoder.decode(body)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise ProtocolViolation(f"the sandbox sent a malformed frame: {exc}") from exc
            try:
                data = await self._recv(loop)
            except (ConnectionResetError, OSError):
                return
            if not data:
                return
            self._buf += data

    async def _recv(self, loop: asyncio.AbstractEventLoop) -> bytes:
        while True:
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(1 << 20, CREDENTIALS_SPACE)
            except (BlockingIOError, InterruptedError):
                fd = self.sock.fileno()
                readable = loop.create_future()
                loop.add_reader(fd, _set_done, readable)
                try:
                    await readable
                finally:
                    if self.sock.fileno() == fd:  # else `close` has unregistered it
                        loop.remove_reader(fd)
                continue
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    self.peer_pid = CREDENTIALS.unpack_from(payload)[0]
            return data

    def close(self) -> None:
        # Unregister before closing: a pending sock_recv left in the selector would read from
        # whichever new socket reuses this fd number.
        if self.sock.fileno() >= 0:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self.sock.fileno())
            loop.remove_writer(self.sock.fileno())
        self.sock.close()
