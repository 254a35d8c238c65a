"""How a service process starts: a bad mesh setting named in one line; a stop asked for while
it still waits for NATS honoured."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_harness.procs import Launcher, base_env
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import NatsServer, free_port


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "FLEET_LOG_LEVEL",
            "LOUD",
            "quality: bad mesh setting: FLEET_LOG_LEVEL: 'LOUD' is not a log level: "
            "use one of DEBUG, INFO, WARNING, ERROR, CRITICAL",
        ),
        (
            "NATS_URL",
            "http://operator:hunter2@127.0.0.1:4222",
            "quality: bad mesh setting: NATS_URL: server 1 of 1 is not a NATS server URL "
            "(scheme 'http'); use nats://host:port or tls://host:port",
        ),
    ],
)
def test_a_bad_setting_stops_the_process_with_one_line_naming_it(
    nats_server: NatsServer, variable: str, value: str, expected: str
) -> None:
    env = base_env(nats_server.url, "quality-0", "quality") | {variable: value}
    done = subprocess.run(
        [sys.executable, "-m", "fleet_quality"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [expected]
    assert "hunter2" not in done.stderr + done.stdout


async def test_sigterm_stops_a_service_still_waiting_for_nats(tmp_path: Path) -> None:
    """nats-py retries the first connection forever: SIGTERM must still end the process."""
    launcher = Launcher(nats_url=f"nats://127.0.0.1:{free_port()}", log_dir=tmp_path)
    try:
        (replica,) = launcher.start("quality")
        await eventually(
            lambda: '"msg": "connecting"' in replica.logs(), timeout=20, what="quality connecting"
        )
        # 0 is a requested stop; SIGKILL after 10 s (the old runtime never saw the signal,
        # which only set an event nothing waited on until after the connection) reads -9.
        assert await asyncio.to_thread(replica.stop, 10) == 0
    finally:
        launcher.stop_all()
