"""`fleet chat` through a pseudo-terminal against a real `fleet up`: typed lines are turns,
answers come back on the terminal, Ctrl-C (the byte a terminal sends, not a signal the test
sends) cancels the running turn and a second one leaves. The agent runs the scripted test
fake so a turn can be held at a barrier while the test presses Ctrl-C."""

import contextlib
import os
import pty
import re
import select
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from fleet_cli.mesh import gateway_dir
from fleet_harness.waits import eventually
from fleet_mesh.tokens import dev_token

from .conftest import Mesh, StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """The chat's terminal: everything it printed so far, read with a bounded wait."""

    def __init__(self, mesh: Mesh, env_extra: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
        env |= env_extra or {}
        argv = [sys.executable, "-m", "fleet_cli", "chat", "--data-dir", str(mesh.data_dir)]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal
            os.execve(sys.executable, argv, env)  # noqa: S606 - argv is ours, no shell
        self.seen = b""
        self.status: int | None = None  # set once reaped: its pid is then no longer ours

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait_for(self, needle: str, after: int = 0, timeout: float = 60) -> int:
        """The offset just past `needle`'s first appearance after `after`."""
        deadline = time.monotonic() + timeout
        while True:
            plain = ANSI.sub(b"", self.seen).decode(errors="replace")
            found = plain.find(needle, after)
            if found >= 0:
                return found + len(needle)
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} never appeared; the terminal shows:\n{plain[-3000:]}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:  # the child exited and the pty closed
                    raise AssertionError(f"{needle!r} never appeared; it ended:\n{plain}") from None

    def exit_status(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            ready, _, _ = select.select([self.fd], [], [], 0.2)  # drain while it exits
            if ready:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.fd, 65536)
        raise AssertionError("the chat did not exit")


async def test_chat_answers_a_line_and_ctrl_c_cancels_a_held_turn_then_leaves(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    barriers = tmp_path / "barriers"
    barriers.mkdir()
    mesh = start_mesh(
        env={"FLEET_AGENT_RUNNER": "scripted", "FLEET_AGENT_BARRIER_DIR": str(barriers)}
    )

    def ready() -> bool:
        assert mesh.process.poll() is None, mesh.printed()[-3000:]
        try:
            return mesh.ready().status_code == 200
        except OSError:
            return False

    await eventually(ready, timeout=120, interval=0.25, what="/ready")
    term = Terminal(mesh)
    try:
        at = term.wait_for("you> ")
        term.type(b"hello there\r")
        at = term.wait_for("fleet> hello there", at)
        at = term.wait_for("you> ", at)

        term.type(b"wait [hold:h] here\r")
        await eventually(lambda: (barriers / "h.reached.1").exists(), timeout=60,
                         what="the turn to reach its barrier")  # fmt: skip
        term.type(b"\x03")  # Ctrl-C: the terminal's SIGINT to the chat
        at = term.wait_for("turn cancelled", at)
        at = term.wait_for("you> ", at)  # still chatting

        term.type(b"wait [hold:g] again\r")
        await eventually(lambda: (barriers / "g.reached.1").exists(), timeout=60,
                         what="the second turn to reach its barrier")  # fmt: skip
        term.type(b"\x03")
        term.wait_for("Ctrl-C again to leave", at)
        term.type(b"\x03")
        assert term.exit_status() == 130
    finally:
        if term.status is None:  # a failed assertion left it running
            os.kill(term.pid, 9)
            term.exit_status()
        os.close(term.fd)


class Cutter:
    """A TCP relay between the chat and the gateway, in threads of its own (the terminal's
    reads block the test's loop), whose `cut()` drops every connection open through it, as a
    network drop does; new connections go through as before."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        with self.lock:
            dropped, self.open = self.open, []
            self.cuts += 1
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


async def test_chat_resumes_a_turn_after_the_socket_drops_and_shows_its_answer(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    barriers = tmp_path / "barriers"
    barriers.mkdir()
    mesh = start_mesh(
        env={"FLEET_AGENT_RUNNER": "scripted", "FLEET_AGENT_BARRIER_DIR": str(barriers)}
    )

    def ready() -> bool:
        assert mesh.process.poll() is None, mesh.printed()[-3000:]
        try:
            return mesh.ready().status_code == 200
        except OSError:
            return False

    await eventually(ready, timeout=120, interval=0.25, what="/ready")
    relay = Cutter(int(mesh.gateway.rsplit(":", 1)[1]))
    token = dev_token(gateway_dir(mesh.data_dir))
    term = Terminal(mesh, {"FLEET_URL": f"http://127.0.0.1:{relay.port}", "FLEET_TOKEN": token})
    try:
        at = term.wait_for("you> ")
        term.type(b"hello [hold:d] there\r")
        await eventually(lambda: (barriers / "d.reached.1").exists(), timeout=60,
                         what="the turn to reach its barrier")  # fmt: skip
        relay.cut()  # the socket drops while the turn runs on in the mesh
        at = term.wait_for("socket dropped; resuming after seq", at)
        (barriers / "d").write_text("go")  # the turn ends while the chat is on its new socket
        at = term.wait_for("fleet> hello there", at)
        at = term.wait_for("you> ", at)
        term.type(b"\x04")  # Ctrl-D at the prompt: leave
        assert term.exit_status() == 0
    finally:
        relay.close()
        if term.status is None:
            os.kill(term.pid, 9)
            term.exit_status()
        os.close(term.fd)
