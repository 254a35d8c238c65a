"""Holes found after issues 11, 12 and 14, each replayed against a real gateway on a real
nats-server: a tenant putting itself on the operator's Daytona account (or sizing the warm pool)
through its own settings; a WebSocket `message` to a purged session id opening a new session
under it; an API token minting more tokens for its user. Each refusal stores nothing."""

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from tests.integration.gateway.api_kit import Api, running_api, tenant_id
from tests.integration.gateway.ws_kit import frames_until, serve

from fleet_events import streams
from fleet_events.config import SETTINGS, tenant_key
from fleet_events.session import log_subject, run_subject, session_filter
from fleet_events.signing import CHECKPOINT, KeySet, Signer
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.checkpoints import Checkpointer, checkpoint_file, serve_purges
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore, open_store
from fleet_mesh.tokens import issue_token, signing_secret

SETTINGS_PATH = "/api/v1/runtime/settings"
TOKENS = "/api/v1/auth/tokens"


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running


def _admin(api: Api, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"}


async def _stored(js: JetStreamContext, key: str) -> bytes | None:
    kv = await js.key_value(streams.CONFIG.bucket)
    try:
        return (await kv.get(key)).value
    except KeyNotFoundError:
        return None


# -- 1. operator-only settings ---------------------------------------------------------------


def test_the_deployment_level_settings_are_marked_operator_only() -> None:
    marked = {s.key for s in SETTINGS if s.operator_only}
    assert marked == {"sandbox_provider", "sandbox_warm_pool_size"}


async def test_a_tenant_cannot_set_or_clear_an_operator_only_setting_for_itself(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    cases: tuple[dict[str, str | int | None], ...] = (
        {"sandbox_provider": "daytona"},
        {"sandbox_warm_pool_size": 50},
        {"sandbox_provider": None},  # clearing an admin's choice for the tenant is a write too
        # a good tenant value first: the whole request is refused, nothing of it stored
        {"rlm_max_depth": "2", "sandbox_provider": "daytona"},
    )
    for updates in cases:
        refused = await api.call("PATCH", SETTINGS_PATH, tenant, json={"updates": updates})
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert body["code"] == "admin_required"
        key = next(k for k in updates if k.startswith("sandbox_"))
        assert body["details"]["key"] == key
        for word in (key, "admin", f"{SETTINGS_PATH}/tenants/{tenant}"):
            assert word in body["message"], (word, body["message"])
    for key in ("sandbox_provider", "sandbox_warm_pool_size", "rlm_max_depth"):
        assert await _stored(js, tenant_key(tenant, key)) is None, f"{key} was stored"

    shown = await api.call("GET", SETTINGS_PATH, tenant)
    flags = {i["key"]: i["operator_only"] for i in shown.json()["items"]}
    assert flags["sandbox_provider"] is True
    assert flags["rlm_max_depth"] is False
    # the tenant's own settings stay the tenant's
    own = await api.call("PATCH", SETTINGS_PATH, tenant, json={"updates": {"rlm_max_depth": 2}})
    assert own.status_code == 200, own.text
    assert await _stored(js, tenant_key(tenant, "rlm_max_depth")) == b"2"


async def test_an_admin_sets_a_named_tenants_provider_and_a_tenant_cannot_use_that_path(
    api: Api, js: JetStreamContext
) -> None:
    operator, customer = tenant_id(), tenant_id()
    path = f"{SETTINGS_PATH}/tenants/{customer}"
    body = {"updates": {"sandbox_provider": "daytona"}}

    for asker in (customer, operator):  # a non-admin: neither its own tenant nor another
        refused = await api.call("PATCH", path, asker, json=body)
        assert (refused.status_code, refused.json()["code"]) == (403, "admin_required")
        looked = await api.call("GET", path, asker)
        assert (looked.status_code, looked.json()["code"]) == (403, "admin_required")
    assert await _stored(js, tenant_key(customer, "sandbox_provider")) is None

    done = await api.client.patch(path, json=body, headers=_admin(api, operator))
    assert done.status_code == 200, done.text
    assert (done.json()["tenant"], done.json()["updated"]) == (customer, ["sandbox_provider"])
    assert await _stored(js, tenant_key(customer, "sandbox_provider")) == b"daytona"
    assert await _stored(js, tenant_key(operator, "sandbox_provider")) is None

    seen = await api.call("GET", SETTINGS_PATH, customer)
    provider = next(i for i in seen.json()["items"] if i["key"] == "sandbox_provider")
    assert (provider["value"], provider["source"]) == ("daytona", "tenant")
    viewed = await api.client.get(path, headers=_admin(api, operator))
    assert viewed.status_code == 200
    assert viewed.json()["tenant"] == customer

    bad = await api.client.patch(path, json={"updates": {"sandbox_provider": "aws"}},
                                 headers=_admin(api, operator))  # fmt: skip
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid_setting")
    odd = await api.client.patch(f"{SETTINGS_PATH}/tenants/a.b", json=body,
                                 headers=_admin(api, operator))  # fmt: skip
    assert odd.status_code == 422, odd.text
    assert await _stored(js, tenant_key(customer, "sandbox_provider")) == b"daytona"

    cleared = await api.client.patch(path, json={"updates": {"sandbox_provider": None}},
                                     headers=_admin(api, operator))  # fmt: skip
    assert cleared.status_code == 200, cleared.text
    assert await _stored(js, tenant_key(customer, "sandbox_provider")) is None


# -- 4. API tokens do not mint API tokens -----------------------------------------------------


async def test_an_api_token_cannot_issue_tokens_and_nothing_is_issued(api: Api) -> None:
    tenant = tenant_id()
    first = await api.call("POST", TOKENS, tenant, "dave", json={"name": "ci", "ttl_s": 600})
    assert first.status_code == 201, first.text
    token = first.json()["token"]
    bearer = {"Authorization": f"Bearer {token}"}

    for ask in ({"name": "more", "ttl_s": 600}, {"name": "longer", "ttl_s": 10**7}):
        refused = await api.client.post(TOKENS, json=ask, headers=bearer)
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "login_required"
        assert "API token" in refused.json()["message"]
    # the token still works for everything else, and only the first token exists
    listed = await api.client.get(TOKENS, headers=bearer)
    assert listed.status_code == 200, listed.text
    assert [t["name"] for t in listed.json()["items"]] == ["ci"]


# -- 3. a purged session's id is not reused ---------------------------------------------------


@pytest.fixture
async def purging(private_nats: NatsServer, tmp_path: Path) -> AsyncIterator[EventStore]:
    """The private server's session store with a real checkpointer serving purges."""
    nc: Client = await connect(private_nats.url, name="hardening-purge")
    js = nc.jetstream()
    await bootstrap(js)
    store = await open_store(js, streams.SESSIONS)
    key = Signer.generate("checkpointer", CHECKPOINT)
    path = checkpoint_file(tmp_path / "checkpoints", streams.SESSIONS.name)
    path.parent.mkdir(mode=0o700)
    checkpointer = Checkpointer(
        store, streams.SESSIONS, key, KeySet.of([key], require_signatures=False), path, js=js
    )
    served = await serve_purges(nc, checkpointer)
    yield store
    await served.stop()
    await nc.close()


@pytest.mark.slow
async def test_a_message_to_a_purged_session_is_refused_and_opens_nothing(
    private_nats: NatsServer, purging: EventStore, tmp_path: Path
) -> None:
    tenant = tenant_id()
    async with serve(private_nats.url, tmp_path / "gw") as gw, gw.client(tenant) as http:
        made = await http.post("/api/v1/sessions", json={"title": "to forget"})
        session = made.json()["session"]["id"]
        assert (await http.delete(f"/api/v1/sessions/{session}")).status_code == 200
        admin = issue_token(signing_secret(gw.data_dir), tenant=tenant, user="root", admin=True)
        purged = await http.post(
            f"/api/v1/sessions/{session}/purge", headers={"Authorization": f"Bearer {admin}"}
        )
        assert purged.status_code == 200, purged.text
        left = [raw.subject async for raw in purging.read_raw(session_filter(tenant, session))]
        assert left == [run_subject(tenant, session, "purge")]

        ws = await gw.socket(tenant)
        await ws.send(json.dumps({"type": "message", "session_id": session, "content": "hi"}))
        frame = (await frames_until(ws, lambda got: len(got) == 1))[0]
        assert frame["type"] == "error", frame
        assert frame["code"] == "session_not_found"
        assert "purged" in frame["message"]
        assert session in frame["message"]
        # the same socket still opens a fresh session (the refusal is about the id)
        fresh = f"{session}x"
        await ws.send(json.dumps({"type": "message", "session_id": fresh, "content": "hi"}))
        await frames_until(ws, lambda got: any(f["type"] == "accepted" for f in got))
        await ws.close()

        turn = await http.post(f"/api/v1/sessions/{session}/turns", json={"message": "again"})
        assert (turn.status_code, turn.json()["code"]) == (404, "session_not_found")
        assert (await purging.head(log_subject(tenant, session))).seq == 0
        after = [raw.subject async for raw in purging.read_raw(session_filter(tenant, session))]
        assert after == left  # nothing stored under the purged id


# -- 2. what a tenant learns of the deployment from the status page --------------------------


async def test_the_runtime_status_names_no_deployment_address_to_a_tenant(
    api: Api, nats_server: NatsServer
) -> None:
    tenant = tenant_id()
    address = nats_server.url.split("://", 1)[1]  # host:port of the mesh's NATS
    full = await api.client.get("/api/v1/runtime/status", headers=_admin(api, tenant))
    assert full.status_code == 200, full.text
    nats = next(c for c in full.json()["components"] if c["name"] == "nats")
    assert address in nats["detail"]  # what a leak would show: the admin's view has it

    seen = await api.call("GET", "/api/v1/runtime/status", tenant)
    assert seen.status_code == 200, seen.text
    assert address not in seen.text
    mine = seen.json()["components"]
    assert [(c["name"], c["state"]) for c in mine] == [
        (c["name"], c["state"]) for c in full.json()["components"]
    ]
    assert all(c["detail"] == "" and c["replica"] is None for c in mine)
