"""`GET /api/v1/sessions/{id}/audit` against a real nats-server: an untouched log verifies, a
raw publish that breaks the chain is named by sequence and id, unsigned events are named when
the gateway pins a key set that requires signatures, another tenant's session is 404."""

import json
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from fleet_events import Envelope, new_id, streams, utc_now
from fleet_events.chain import GENESIS, HASH_HEADER, PREV_HEADER, link
from fleet_events.codec import Codec
from fleet_events.session import SessionCreated, TurnRequested, log_subject
from fleet_events.signing import KeySet, Signer
from fleet_mesh.checkpoints import KEYSET_ENV
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store.headers import MSG_ID

from .ws_kit import OTHER, Gateway, serve, writer


@pytest.fixture
async def gateway(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> Any:
    async with serve(nats_server.url, tmp_path / "gw") as gw:
        yield gw


async def _session(js: JetStreamContext, tenant: str) -> str:
    session = new_id()
    log = await writer(js)
    await log.append(tenant, session, SessionCreated(title="audited"))
    await log.append(tenant, session, TurnRequested(message="hello"), turn=new_id())
    return session


async def _audit(gw: Gateway, tenant: str, session: str) -> tuple[int, dict[str, Any]]:
    async with gw.client(tenant) as client:
        response = await client.get(f"/api/v1/sessions/{session}/audit")
    body: dict[str, Any] = response.json()
    return response.status_code, body


async def test_an_untouched_log_verifies_and_a_forged_event_is_named(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant = f"t{new_id()[:8]}"
    session = await _session(js, tenant)
    status, body = await _audit(gateway, tenant, session)
    assert status == 200, body
    assert body == {"session_id": session, "ok": True, "checked": 2, "signatures": False,
                    "require_signatures": False, "fault": None}  # fmt: skip
    # A raw publish whose chain link points at the genesis, not at the log's head.
    subject = log_subject(tenant, session)
    forged = Envelope(id=new_id(), tenant=tenant, session=session, turn=None, actor=OTHER,
                      ts=utc_now(), data=TurnRequested(message="forged"))  # fmt: skip
    payload = Codec().encode_inline(forged)
    headers = {MSG_ID: forged.id, PREV_HEADER: GENESIS, HASH_HEADER: link(GENESIS, payload)}
    ack = await js.publish(subject, payload, headers=headers, stream=streams.SESSIONS.name)
    status, body = await _audit(gateway, tenant, session)
    assert status == 200, body
    assert body["ok"] is False
    assert body["checked"] == 3
    assert body["fault"]["seq"] == ack.seq
    assert body["fault"]["event_id"] == forged.id
    assert body["fault"]["subject"] == subject
    assert body["fault"]["reason"]


async def test_unsigned_events_are_named_when_the_gateway_pins_keys_that_require_signatures(
    gateway: Gateway, js: JetStreamContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = f"t{new_id()[:8]}"
    session = await _session(js, tenant)
    keyset = tmp_path / "keyset.json"
    keyset.write_text(json.dumps(KeySet.of([Signer.generate("agent")]).to_json()))
    monkeypatch.setenv(KEYSET_ENV, str(keyset))
    status, body = await _audit(gateway, tenant, session)
    assert status == 200, body
    assert (body["ok"], body["signatures"], body["require_signatures"]) == (False, True, True)
    assert body["fault"]["seq"] > 0
    assert "unsigned" in body["fault"]["reason"]


async def test_another_tenants_session_is_404_and_a_bad_id_422(
    gateway: Gateway, js: JetStreamContext
) -> None:
    owner, other = f"a{new_id()[:8]}", f"b{new_id()[:8]}"
    session = await _session(js, owner)
    status, body = await _audit(gateway, other, session)
    assert (status, body["code"]) == (404, "session_not_found")
    status, body = await _audit(gateway, owner, "a.b")
    assert (status, body["code"]) == (422, "invalid_session_id")
    async with gateway.client(owner) as client:
        client.headers.pop("Authorization")
        assert (await client.get(f"/api/v1/sessions/{session}/audit")).status_code == 401
