import dataclasses

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import subjects
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.service import Ping, Pong


async def test_a_service_process_answers_ping_and_stops_cleanly_on_sigterm(
    nc: Client, launcher: Launcher
) -> None:
    (replica,) = launcher.start("quality")

    async def ping() -> Pong | None:
        try:
            return await rpc.call(nc, subjects.ping("quality"), Ping(), Pong, timeout=0.5)
        except TimeoutError:
            return None

    pong = await eventually(ping, timeout=20, what="quality to answer ping")
    assert pong.service == "quality"
    assert pong.replica == "quality-0"
    assert pong.pid == replica.pid
    assert replica.stop() == 0
    lines = [
        msgspec.json.decode(line) for line in replica.logs().splitlines() if line.startswith("{")
    ]
    assert [line["msg"] for line in lines][-2:] == ["stopping", "stopped"]
    assert all(line["service"] == "quality" for line in lines)


async def test_bootstrap_is_idempotent_and_keeps_operator_limits(js: JetStreamContext) -> None:
    info = await js.stream_info("BUDGET")
    await js.update_stream(dataclasses.replace(info.config, max_msgs=123_456))
    report = await bootstrap(js)
    assert "stream BUDGET" in report.unchanged
    assert report.created == ()
    assert (await js.stream_info("BUDGET")).config.max_msgs == 123_456


async def test_a_sigkilled_replica_restarts_under_the_same_name(
    nc: Client, launcher: Launcher
) -> None:
    (replica,) = launcher.start("quality")

    async def pong_pid() -> int | None:
        try:
            pong = await rpc.call(nc, subjects.ping("quality"), Ping(), Pong, timeout=0.5)
        except TimeoutError:
            return None
        return pong.pid

    first = await eventually(pong_pid, timeout=20, what="the first quality replica")
    replica.kill()
    assert not replica.alive()
    replica.start()
    second = await eventually(
        lambda: _other_than(pong_pid, first), timeout=20, what="the restarted replica"
    )
    assert second == replica.pid != first


async def _other_than(probe, old: int) -> int | None:  # type: ignore[no-untyped-def]
    pid = await probe()
    return pid if pid not in (None, old) else None
