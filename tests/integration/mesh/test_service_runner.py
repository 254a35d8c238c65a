import dataclasses
import logging
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import bus as verbs
from fleet_events.bus import Ping, Pong
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.bootstrap import BootstrapError, bootstrap
from fleet_mesh.connection import ServerTooOld, connect, require_server_version, server_address
from fleet_mesh.natsserver import NatsServer


async def test_a_service_process_answers_ping_and_stops_cleanly_on_sigterm(
    nc: Client, launcher: Launcher
) -> None:
    (replica,) = launcher.start("quality")

    async def ping() -> Pong | None:
        try:
            return await rpc.call_verb(nc, verbs.ping("quality"), Ping(), timeout=0.5)
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
            pong = await rpc.call_verb(nc, verbs.ping("quality"), Ping(), timeout=0.5)
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


async def test_logs_and_errors_name_the_server_without_its_credentials(
    tmp_path: Path,
) -> None:
    server = NatsServer(store_dir=tmp_path / "store", sync_interval="2m")
    server.config_text = lambda: (  # type: ignore[method-assign]
        f'listen: "127.0.0.1:{server.port}"\nauthorization {{ user: fleet, password: s3cr3tpw }}\n'
    )
    server.start()
    try:
        nc = await connect(f"nats://fleet:s3cr3tpw@127.0.0.1:{server.port}")
        assert server_address(nc) == f"127.0.0.1:{server.port}"
        with pytest.raises(ServerTooOld) as refused:
            require_server_version(nc, minimum=(99, 0, 0))
        assert "s3cr3tpw" not in str(refused.value)
        assert f"127.0.0.1:{server.port}" in str(refused.value)
        await nc.close()
    finally:
        server.stop()


async def test_bootstrap_refuses_a_stream_whose_retention_cannot_be_fixed_in_place(
    private_nats: NatsServer,
) -> None:
    nc = await connect(private_nats.url)
    js = nc.jetstream()
    await js.add_stream(name="WORK", subjects=["fleet.work.>"])  # limits, not work-queue
    with pytest.raises(BootstrapError, match=r"WORK exists with .*limits.* retention"):
        await bootstrap(js)
    await nc.close()


async def test_bootstrap_logs_what_it_did_at_info(
    js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="fleet.bootstrap"):
        await bootstrap(js)
    (record,) = [r for r in caplog.records if r.getMessage() == "bootstrap done"]
    assert "stream SESSIONS" not in record.made  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_a_service_stops_promptly_on_sigterm_when_nats_is_already_gone(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    launcher = Launcher(nats_url=private_nats.url, log_dir=tmp_path)
    (replica,) = launcher.start("quality")
    nc = await connect(private_nats.url)

    async def ping() -> Pong | None:
        try:
            return await rpc.call_verb(nc, verbs.ping("quality"), Ping(), timeout=0.5)
        except TimeoutError:
            return None

    await eventually(ping, timeout=20, what="quality to answer ping")
    await nc.close()
    private_nats.kill()
    assert replica.stop(timeout=20) == 0  # exited by itself: stop() SIGKILLs only after 20 s
    assert "stopped" in replica.logs()
