"""What a running cell prints reaches the session's live subject while the cell runs.

The cell prints, then blocks in a host tool until the test has heard that print on
`fleet.live.<tenant>.<session>` as a `cell_output` delta of the run: before, a cell's output
went live only once the cell had answered (one delta per cell), so the tool waited in vain.
The path: the runner sends `out` frames (at most every 100 ms) to the broker, which publishes
`CellOutput` to the interpreter owning the context (`fleet.callback.<interpreter>.output`),
which relays it as a live delta. A real broker and a real sandbox.
"""

import threading
from collections.abc import Iterator

import msgspec
import pytest
from nats.aio.msg import Msg

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events.bus import LiveDelta
from fleet_events.sandbox import SandboxInfo
from fleet_events.subjects import live
from fleet_harness.procs import Replica, start_answering
from fleet_harness.waits import eventually_sync
from fleet_mesh.natsserver import NatsServer

TENANT, SESSION, RUN = "t-cell-live", "s-live", "run-live"


@pytest.fixture(scope="module")
def broker(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    root = tmp_path_factory.mktemp("cell-live")
    replica = start_answering(
        "sandbox-broker", nats_server.url, root / "broker.log",
        {
            "FLEET_SANDBOX_ROOT": str(root / "root"), "FLEET_SANDBOX_UID_BASE": "350100",
            "FLEET_SANDBOX_UID_COUNT": "64",
        },
    )  # fmt: skip
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def bus(broker: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant=TENANT) as connected:
        yield connected


@pytest.fixture
def sandbox(bus: SandboxBus) -> Iterator[SandboxInfo]:
    info = bus.create_sandbox(labels={"session": SESSION})
    yield info
    bus.delete_sandbox(info.sandbox)


class Watcher:
    """The session's live subject, as a watcher (the gateway, the UI) hears it."""

    def __init__(self, bus: SandboxBus) -> None:
        self.deltas: list[LiveDelta] = []
        self.heard = threading.Event()
        decode = msgspec.json.Decoder(LiveDelta).decode

        async def on_delta(msg: Msg) -> None:
            delta = decode(msg.data)
            self.deltas.append(delta)
            if "first" in "".join(d.text for d in self.deltas):
                self.heard.set()

        async def subscribe() -> object:
            sub = await bus.nc.subscribe(live(TENANT, SESSION), cb=on_delta)
            await bus.nc.flush()
            return sub

        self.sub = bus.run(subscribe(), timeout=10)


def test_a_running_cells_output_is_live_before_the_cell_ends(
    bus: SandboxBus, sandbox: SandboxInfo
) -> None:
    watcher = Watcher(bus)
    interp = RemoteInterpreter(bus, sandbox.sandbox, live=(live(TENANT, SESSION), RUN))
    interp.tools["wait_until_heard"] = lambda: watcher.heard.wait(20)
    try:
        code = "print('first')\nheard = wait_until_heard()\nprint('second')\nheard"
        assert interp.execute(code) is True  # the print was heard while the cell waited
        # a last chunk the runner sent just before the answer is relayed (and counted) before
        # `execute` returns, but comes back to the watcher one server round trip later
        eventually_sync(
            lambda: len("".join(d.text for d in watcher.deltas)) >= interp.streamed_chars,
            timeout=10, what="every relayed delta heard",
        )  # fmt: skip
        streamed = "".join(d.text for d in watcher.deltas)
        assert streamed.startswith("first\n")
        assert "first\nsecond\n".startswith(streamed)  # in order, nothing twice
        assert {(d.kind, d.run) for d in watcher.deltas} == {("cell_output", RUN)}
        assert interp.streamed_chars == len(streamed)  # what the record's delta leaves out
        # the next cell starts its own count
        assert interp.execute("print('x' * 3)\n1") == 1
        assert interp.streamed_chars <= len("xxx\n")
    finally:
        interp.shutdown()
