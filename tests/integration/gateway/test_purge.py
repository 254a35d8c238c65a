"""Purge, an admin operation, on a server of the test's own with a real checkpointer (the one
holder of the checkpoint key, serving `PURGE_SESSION` as `fleet up` does): a deleted session's
log and runs are gone, a signed receipt accounts for them and verification against the
checkpoints passes (a purge around the checkpointer does not), both replicas drop the
session's rows, a rebuild from sequence 0 equals them; a non-admin is 403, another tenant's
session 404, a live session 409, no checkpointer 503; nothing is purged by any refusal."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.codec import Codec
from fleet_events.run import LlmCalled
from fleet_events.session import run_subject, session_filter
from fleet_events.signing import CHECKPOINT, KeySet, Signer
from fleet_gateway.projections import ProjectionStore, Projector
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.checkpoints import Checkpointer, checkpoint_file, read_checkpoints, serve_purges
from fleet_mesh.connection import connect
from fleet_mesh.keyfiles import read_signer
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import Served
from fleet_mesh.store import EventStore, open_store

AGENT = Actor(service="agent", replica="a-0")
CHECKPOINT_KEY = Signer.generate("checkpointer", CHECKPOINT)
# the gateway here appends unsigned (no FLEET_SIGNING_KEY): the pinned set does not require
# signatures, and still checks the chains and every checkpoint's signature and pins
KEYS = KeySet.of([CHECKPOINT_KEY], require_signatures=False)


class Mesh:
    def __init__(self, nc: Client, store: EventStore, checkpointer: Checkpointer) -> None:
        self.nc, self.store, self.checkpointer = nc, store, checkpointer
        self.served: Served | None = None

    async def serve(self) -> None:
        self.served = await serve_purges(self.nc, self.checkpointer)

    async def unserve(self) -> None:
        if self.served is not None:
            await self.served.stop()
            self.served = None


@pytest.fixture
async def mesh(private_nats: NatsServer, tmp_path: Path) -> AsyncIterator[Mesh]:
    nc = await connect(private_nats.url, name="purge-test")
    js: JetStreamContext = nc.jetstream()
    await bootstrap(js)
    store = await open_store(js, streams.SESSIONS)
    path = checkpoint_file(tmp_path / "checkpoints", streams.SESSIONS.name)
    path.parent.mkdir(mode=0o700)
    checkpointer = Checkpointer(store, streams.SESSIONS, CHECKPOINT_KEY, KEYS, path, js=js)
    mesh = Mesh(nc, store, checkpointer)
    await mesh.serve()
    yield mesh
    await mesh.unserve()
    await nc.close()


def _admin(api: Api, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"}


async def _deleted_session_with_a_run(api: Api, store: EventStore, tenant: str) -> str:
    made = await api.call("POST", "/api/v1/sessions", tenant, json={"title": "secret plans"})
    session = str(made.json()["session"]["id"])
    asked = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": "hello"}
    )
    turn = asked.json()["turn"]
    run = run_subject(tenant, session, "r1")
    step = Envelope(
        id=new_id(), tenant=tenant, session=session, turn=turn, run="r1", actor=AGENT,
        ts=utc_now(), data=LlmCalled(role="root", model="m", prompt_tokens=5),
    )  # fmt: skip
    await store.append(run, step)
    deleted = await api.call("DELETE", f"/api/v1/sessions/{session}", tenant)
    assert deleted.status_code == 200, deleted.text
    return session


async def _subjects(store: EventStore, tenant: str, session: str) -> list[str]:
    return [raw.subject async for raw in store.read_raw(session_filter(tenant, session))]


async def test_an_admin_purge_leaves_a_receipt_that_verifies_and_both_replicas_forget_it(
    private_nats: NatsServer, mesh: Mesh, tmp_path: Path
) -> None:
    async with (
        running_api(private_nats.url, tmp_path / "gw", replica="gateway-a") as a,
        running_api(private_nats.url, tmp_path / "gw", replica="gateway-b") as b,
    ):
        tenant = tenant_id()
        session = await _deleted_session_with_a_run(a, mesh.store, tenant)
        kept = await a.call("POST", "/api/v1/sessions", tenant, json={"title": "kept"})
        kept_id = kept.json()["session"]["id"]
        response = await a.client.post(
            f"/api/v1/sessions/{session}/purge", headers=_admin(a, tenant),
            json={"reason": "the customer asked"},
        )  # fmt: skip
        assert response.status_code == 200, response.text
        body = response.json()
        log, run = f"fleet.session.{tenant}.{session}.log", run_subject(tenant, session, "r1")
        assert set(body["purged"]) == {log, run}

        # the events are gone; what is left is the marker, a new chain of its own
        assert await _subjects(mesh.store, tenant, session) == [
            run_subject(tenant, session, "purge")
        ]
        # the receipt is a signed checkpoint; the whole stream verifies against the chain
        checkpoints = read_checkpoints(mesh.checkpointer._path)
        receipt = next(cp for cp in checkpoints if cp.number == body["receipt"])
        assert receipt.digest() == body["digest"]
        assert {s: list(h) for s, h in receipt.purged.items()} == body["purged"]
        await mesh.checkpointer.checkpoint()  # the marker is pinned too
        checkpoints = read_checkpoints(mesh.checkpointer._path)
        verdict = await mesh.store.verify("fleet.session.>", keys=KEYS, checkpoints=checkpoints)
        assert verdict.ok, verdict.fault

        # both replicas forget it: 404 everywhere, not listed, the other session untouched
        for replica in (a, b):
            await replica.call("GET", "/api/v1/sessions", tenant, params={"min_seq": body["seq"]})
            got = await replica.call("GET", f"/api/v1/sessions/{session}", tenant)
            assert got.status_code == 404, got.text
            listed = await replica.call("GET", "/api/v1/sessions", tenant, params={"status": "all"})
            assert [s["id"] for s in listed.json()["items"]] == [kept_id]
            turn = await replica.call(
                "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": "again?"}
            )
            assert turn.status_code == 404
        assert a.state.projections is not None
        assert b.state.projections is not None
        assert a.state.projections.dump() == b.state.projections.dump()

        # a rebuild from sequence 0 is the live read models byte for byte
        rebuilt = ProjectionStore(None)
        codec = Codec(await JetStreamBlobs.open(mesh.nc.jetstream()))
        await Projector(mesh.nc, mesh.store, codec, rebuilt).catch_up()
        assert rebuilt.dump() == a.state.projections.dump()
        rebuilt.close()


async def test_a_purge_around_the_checkpointer_is_caught_where_the_receipted_one_is_not(
    private_nats: NatsServer, mesh: Mesh, tmp_path: Path
) -> None:
    """The replay of the attack the receipt answers: an admin purging behind the
    checkpointer's back fails verification at the first pinned sequence it removed."""
    async with running_api(private_nats.url, tmp_path / "gw") as api:
        tenant = tenant_id()
        session = await _deleted_session_with_a_run(api, mesh.store, tenant)
        await mesh.checkpointer.checkpoint()
        js = mesh.nc.jetstream()
        await js.purge_stream(streams.SESSIONS.name, subject=run_subject(tenant, session, "r1"))
        checkpoints = read_checkpoints(mesh.checkpointer._path)
        verdict = await mesh.store.verify(
            session_filter(tenant, session), keys=KEYS, checkpoints=checkpoints
        )
        assert verdict.fault is not None
        assert "no purge receipt covers" in verdict.fault.reason


async def test_refusals_say_why_and_purge_nothing(
    private_nats: NatsServer, mesh: Mesh, tmp_path: Path
) -> None:
    async with running_api(private_nats.url, tmp_path / "gw") as api:
        tenant, other = tenant_id(), tenant_id()
        session = await _deleted_session_with_a_run(api, mesh.store, tenant)
        live = (await api.call("POST", "/api/v1/sessions", tenant, json={})).json()["session"]
        before = await _subjects(mesh.store, tenant, session)
        cases: list[tuple[dict[str, str], str, int, str]] = [
            (api.auth(tenant), session, 403, "admin_required"),  # not an admin
            (_admin(api, other), session, 404, "session_not_found"),  # another tenant's
            (_admin(api, tenant), new_id(), 404, "session_not_found"),
            (_admin(api, tenant), live["id"], 409, "session_not_deleted"),
        ]
        for headers, where, status, code in cases:
            response = await api.client.post(f"/api/v1/sessions/{where}/purge", headers=headers)
            assert (response.status_code, response.json()["code"]) == (status, code), where
            assert response.json()["message"]
        bad = await api.client.post(
            f"/api/v1/sessions/{session}/purge", headers=_admin(api, tenant),
            json={"tenant": other},
        )  # fmt: skip
        assert bad.status_code == 422
        await mesh.unserve()
        gone = await api.client.post(
            f"/api/v1/sessions/{session}/purge", headers=_admin(api, tenant)
        )
        assert gone.status_code == 503
        assert gone.json()["code"] == "audit_unavailable"
        assert await _subjects(mesh.store, tenant, session) == before
        assert (await api.call("GET", f"/api/v1/sessions/{session}", tenant)).status_code == 200


async def test_the_checkpointer_itself_refuses_a_session_that_is_not_deleted(
    private_nats: NatsServer, mesh: Mesh, tmp_path: Path
) -> None:
    """Whoever reaches the verb on the bus, not only the gateway, can purge only what its
    owner deleted."""
    from fleet_events import bus
    from fleet_events.session import PurgeSession
    from fleet_mesh import rpc

    async with running_api(private_nats.url, tmp_path / "gw") as api:
        tenant = tenant_id()
        live = (await api.call("POST", "/api/v1/sessions", tenant, json={})).json()["session"]
        ask = PurgeSession(request_id=new_id(), tenant=tenant, session=live["id"], by="eve")
        with pytest.raises(rpc.RemoteError) as refused:
            await rpc.call_verb(mesh.nc, bus.PURGE_SESSION, ask, timeout=10)
        assert refused.value.code == "bad_request"
        assert "not deleted" in refused.value.message
        assert await _subjects(mesh.store, tenant, live["id"]) != []


async def test_a_purge_through_fleet_ups_checkpointer_verifies_with_signatures_required(
    private_nats: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real wiring: the keys `fleet up` makes, its checkpointer role (`fleet_cli.keys.
    checkpointing`, which serves the verb), a gateway signing with its own key, an agent's
    signed run step, and an auditor pinning the key set with signatures required."""

    from fleet_cli.keys import checkpointing, ensure_keys, key_path
    from fleet_events.signing import SIGNING_KEY_ENV
    from fleet_events.subjects import SERVICES

    data = tmp_path / "data"
    keys = ensure_keys(data, SERVICES)
    assert keys.require_signatures
    nc = await connect(private_nats.url, name="test")
    await bootstrap(nc.jetstream(), env={})
    agent = await open_store(
        nc.jetstream(), streams.SESSIONS, signer=read_signer(key_path(data, "agent"))
    )
    monkeypatch.setenv(SIGNING_KEY_ENV, str(key_path(data, "gateway")))
    try:
        async with (
            checkpointing(private_nats.url, data, interval_s=3600) as checkpointer,
            running_api(private_nats.url, tmp_path / "gw") as api,
        ):
            tenant = tenant_id()
            session = await _deleted_session_with_a_run(api, agent, tenant)
            purged = await api.client.post(
                f"/api/v1/sessions/{session}/purge", headers=_admin(api, tenant)
            )
            assert purged.status_code == 200, purged.text
            await checkpointer.checkpoint()
            checkpoints = read_checkpoints(checkpointer._path)
            assert checkpoints[-1].number > purged.json()["receipt"]  # the marker is pinned
            verdict = await agent.verify("fleet.session.>", keys=keys, checkpoints=checkpoints)
            assert verdict.ok, verdict.fault
            assert verdict.checked >= 1  # the marker, signed by the gateway
    finally:
        await nc.close()
