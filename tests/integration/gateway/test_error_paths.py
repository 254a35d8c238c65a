"""Error paths that were server errors or holes: a checkout with no broker on the bus was a
500 (now 503 `sandbox_unavailable`, saying what to do); a WebSocket `message` went past the
tenant's concurrent-turn quota the HTTP route enforces (now the same 429 as an error frame,
nothing stored, the socket usable)."""

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.session import SessionCreated, session_filter
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import serve, writer


async def _events(js: JetStreamContext, tenant: str, session: str) -> int:
    store = await open_store(js, streams.SESSIONS)
    return len([r async for r in store.read_raw(session_filter(tenant, session))])


async def test_a_checkout_with_no_broker_on_the_bus_is_503_saying_what_to_do(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    """A server of its own: no broker answers `create` there (the shared one may have one)."""
    from fleet_mesh.bootstrap import bootstrap
    from fleet_mesh.connection import connect

    nc = await connect(private_nats.url, name="test")
    js = nc.jetstream()
    await bootstrap(js, env={})
    tenant, session = f"t{new_id()[:8]}", new_id()
    await (await writer(js)).append(tenant, session, SessionCreated(title="c"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("README.md")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"hi\n"))
    try:
        async with serve(private_nats.url, tmp_path / "gw") as gw, gw.client(tenant) as client:
            response = await client.post(
                f"/api/v1/sessions/{session}/checkout",
                files={"bundle": ("c.tgz", buffer.getvalue())},
            )
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["code"] == "sandbox_unavailable"
        assert "start one" in body["message"]
        assert response.headers["Retry-After"] == "5"
        assert await _events(js, tenant, session) == 1  # no SandboxAttached
    finally:
        await nc.close()


async def test_a_socket_message_over_the_tenants_turn_quota_is_refused_and_stores_nothing(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with serve(nats_server.url, tmp_path / "gw", tenant_concurrent_turns=1) as gw:
        tenant, first, second = f"t{new_id()[:8]}", new_id(), new_id()
        ws = await gw.socket(tenant)

        async def frame(body: dict[str, Any]) -> dict[str, Any]:
            await ws.send(json.dumps(body))
            while True:
                got: dict[str, Any] = json.loads(await ws.recv())
                if got["type"] in ("accepted", "error"):
                    return got

        accepted = await frame({"type": "message", "content": "one", "session_id": first})
        assert accepted["type"] == "accepted", accepted
        async with gw.client(tenant) as client:  # this replica has folded the queued turn
            turns = await client.get(
                f"/api/v1/sessions/{first}/turns", params={"min_seq": accepted["seq"]}
            )
            assert [t["status"] for t in turns.json()["items"]] == ["queued"]
        refused = await frame({"type": "message", "content": "two", "session_id": second})
        assert refused["type"] == "error", refused
        assert refused["code"] == "too_many_turns"
        assert "its limit is 1" in refused["message"]
        assert await _events(js, tenant, second) == 0
        # the socket stays usable: a cancel of the first turn goes through
        cancelled = await frame({"type": "cancel", "session_id": first})
        assert cancelled["type"] == "accepted", cancelled
        await ws.close()
