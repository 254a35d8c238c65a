"""The turn routes against a real mesh: two gateway processes and an agent process (the
scripted runner, which holds a turn on a barrier file) on a server of this test's own. A turn
asked on one replica runs, is refused while another runs (the dispatcher's `busy`), is
cancelled from the other replica, and both replicas answer every read the same."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client
from tests.integration.gateway.api_kit import tenant_id

from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer, free_port
from fleet_mesh.tokens import issue_token, signing_secret

pytestmark = pytest.mark.slow


@pytest.fixture
def mesh(private_nats: NatsServer, tmp_path: Path) -> Iterator[tuple[list[str], Path, Path]]:
    logs = tmp_path / "logs"
    logs.mkdir()
    barriers = tmp_path / "barriers"
    barriers.mkdir()
    data_dir = tmp_path / "gateway"
    launcher = Launcher(nats_url=private_nats.url, log_dir=logs)
    urls = []
    try:
        for _ in range(2):
            port = free_port()
            launcher.start(
                "gateway",
                env={"FLEET_GATEWAY_PORT": str(port), "FLEET_GATEWAY_DATA_DIR": str(data_dir)},
            )
            urls.append(f"http://127.0.0.1:{port}")
        launcher.start(
            "agent",
            env={
                "FLEET_AGENT_RUNNER": "scripted",
                "FLEET_AGENT_BARRIER_DIR": str(barriers),
                "FLEET_AGENT_ACK_WAIT_S": "5",
            },
        )
        yield urls, data_dir, barriers
    finally:
        launcher.stop_all()


async def _bootstrapped(url: str) -> Client:
    nc = await connect(url, name="test")
    await bootstrap(nc.jetstream())
    return nc


async def test_turns_run_refuse_and_cancel_across_two_gateway_replicas(
    private_nats: NatsServer, mesh: tuple[list[str], Path, Path]
) -> None:
    nc = await _bootstrapped(private_nats.url)
    urls, data_dir, barriers = mesh
    tenant = tenant_id()
    token = issue_token(signing_secret(data_dir), tenant=tenant, user="dana")
    headers = {"Authorization": f"Bearer {token}"}
    a = httpx.AsyncClient(base_url=urls[0], headers=headers, timeout=30)
    b = httpx.AsyncClient(base_url=urls[1], headers=headers, timeout=30)

    async def up(client: httpx.AsyncClient) -> bool:
        return (await client.get("/api/v1/auth/me")).status_code == 200

    async def turns(client: httpx.AsyncClient, session: str, seq: int = 0) -> list[Any]:
        answer = await client.get(f"/api/v1/sessions/{session}/turns", params={"min_seq": seq})
        assert answer.status_code == 200, answer.text
        return list(answer.json()["items"])

    try:
        await eventually(lambda: up(a), timeout=30, what="gateway replica a")
        await eventually(lambda: up(b), timeout=30, what="gateway replica b")
        created = await a.post("/api/v1/sessions", json={"title": "mesh"})
        session = created.json()["session"]["id"]
        held = await a.post(f"/api/v1/sessions/{session}/turns", json={"message": "[hold:h1] hi"})
        first = held.json()["turn"]
        await eventually(
            lambda: (barriers / "h1.reached.1").exists(), timeout=30, what="the turn to run"
        )
        busy = await b.post(f"/api/v1/sessions/{session}/turns", json={"message": "second"})
        second = busy.json()["turn"]

        async def refused() -> dict[str, Any] | None:
            found = {t["id"]: t for t in await turns(a, session, busy.json()["seq"])}
            return found[second] if found[second]["status"] == "refused" else None

        refusal = await eventually(refused, timeout=30, what="the second turn refused")
        assert refusal["code"] == "busy"
        assert first in refusal["error"]
        cancel = await b.post(
            f"/api/v1/sessions/{session}/cancel",
            params={"min_seq": held.json()["seq"]},
            json={"reason": "stop"},
        )
        assert cancel.status_code == 202
        assert cancel.json()["turn"] == first  # the running one, found by the projection

        async def cancelled() -> bool:
            found = {t["id"]: t for t in await turns(a, session)}
            return bool(found[first]["status"] == "cancelled")

        await eventually(cancelled, timeout=30, what="the held turn cancelled")
        echo = await a.post(f"/api/v1/sessions/{session}/turns", json={"message": "say this"})
        third = echo.json()["turn"]

        async def completed() -> dict[str, Any] | None:
            found = {t["id"]: t for t in await turns(b, session)}
            done = found.get(third)
            return done if done and done["status"] == "completed" else None

        done = await eventually(completed, timeout=30, what="the third turn answered")
        assert done["assistant_message"] == "say this"
        last = done["last_seq"]
        for path in ("", "/turns", "/state", "/stats"):
            got = [
                (await c.get(f"/api/v1/sessions/{session}{path}", params={"min_seq": last})).json()
                for c in (a, b)
            ]
            for answer in got:  # `seq` says how far each replica had folded: may differ
                answer.pop("seq", None)
            assert got[0] == got[1], path
        history = (await b.get(f"/api/v1/sessions/{session}/state")).json()["history"]
        assert [h["answer"] for h in history] == ["say this"]
        stranger = httpx.AsyncClient(
            base_url=urls[1],
            headers={
                "Authorization": "Bearer "
                + issue_token(signing_secret(data_dir), tenant=tenant_id(), user="eve")
            },
        )
        for path in ("", "/turns", "/state", "/stats"):
            assert (await stranger.get(f"/api/v1/sessions/{session}{path}")).status_code == 404
        await stranger.aclose()
    finally:
        await a.aclose()
        await b.aclose()
        await nc.close()
