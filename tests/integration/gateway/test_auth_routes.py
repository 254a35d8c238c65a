"""`/api/v1/auth/*` and WebSocket tickets on a real nats-server: identity from the token only,
tickets single use across replicas, even when redeemed at the same instant."""

import asyncio
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import running_api, tenant_id

from fleet_gateway.auth import Principal
from fleet_gateway.errors import ApiError
from fleet_gateway.tickets import Tickets
from fleet_mesh import kvscan
from fleet_mesh.natsserver import NatsServer


async def test_me_answers_from_the_token_and_nothing_else(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path) as api:
        tenant = tenant_id()
        response = await api.call(
            "GET", "/api/v1/auth/me", tenant, "bob", params={"tenant": "other", "user": "eve"}
        )
        assert response.status_code == 200
        assert response.json() == {"tenant": tenant, "user": "bob", "admin": False}
        anonymous = await api.client.get("/api/v1/auth/me")
        assert anonymous.status_code == 401
        assert anonymous.json()["code"] == "auth_required"
        assert anonymous.headers["www-authenticate"] == "Bearer"
        basic = await api.client.get("/api/v1/auth/me", headers={"Authorization": "Basic eDp5"})
        assert basic.status_code == 401


async def test_a_ticket_is_redeemed_once_on_another_replica_then_never_again(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with (
        running_api(nats_server.url, tmp_path, replica="gateway-a") as a,
        running_api(nats_server.url, tmp_path, replica="gateway-b") as b,
    ):
        tenant = tenant_id()
        minted = await a.call("POST", "/api/v1/auth/ws-ticket", tenant, "carol")
        assert minted.status_code == 200
        body = minted.json()
        assert body["ttl_s"] == 60.0
        assert b.state.tickets is not None
        principal = await b.state.tickets.redeem(body["ticket"])
        assert (principal.tenant, principal.user, principal.admin) == (tenant, "carol", False)
        for replica in (a, b):
            assert replica.state.tickets is not None
            with pytest.raises(ApiError) as used:
                await replica.state.tickets.redeem(body["ticket"])
            assert used.value.status == 401
            assert used.value.code == "invalid_ticket"
            assert "already used" in used.value.message


async def test_twenty_replicas_racing_on_one_ticket_let_exactly_one_in(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path) as api:
        minted = await api.call("POST", "/api/v1/auth/ws-ticket", tenant_id())
        ticket = minted.json()["ticket"]
        tickets = api.state.tickets
        assert tickets is not None
        results = await asyncio.gather(
            *(tickets.redeem(ticket) for _ in range(20)), return_exceptions=True
        )
        admitted = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ApiError) and r.code == "invalid_ticket"]
        assert len(admitted) == 1
        assert len(refused) == 19


async def test_an_expired_malformed_or_unknown_ticket_is_refused(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path) as api:
        tickets = api.state.tickets
        assert tickets is not None
        # minted already past its lifetime (the bucket's TTL is only the upper bound)
        stale = Tickets(await js.key_value("fleet-tickets"), ttl_s=-1.0)
        ticket, _ = await stale.mint(Principal(tenant=tenant_id(), user="u"))
        for candidate, says in (
            (ticket, "expired"),
            ("x" * 43, "unknown"),
            ("short", "malformed"),
            ("../../" + "a" * 37, "malformed"),
        ):
            with pytest.raises(ApiError) as refused:
                await tickets.redeem(candidate)
            assert says in refused.value.message, refused.value.message


async def test_the_ticket_bucket_holds_no_ticket_a_reader_could_use(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path) as api:
        minted = await api.call("POST", "/api/v1/auth/ws-ticket", tenant_id())
        ticket = minted.json()["ticket"]
        keys = [entry.key for entry in await kvscan.latest(js, "fleet-tickets")]
        assert keys, "the minted ticket left nothing in the bucket: this test would prove nothing"
        assert ticket not in keys
        assert api.state.tickets is not None
        for key in keys:  # a key read from the bucket is not itself a ticket
            try:
                await api.state.tickets.redeem(key[:43])
            except ApiError:
                continue
            raise AssertionError("a bucket key redeemed as a ticket")


async def test_the_ticket_bucket_forgets_unredeemed_tickets_after_its_ttl(
    js: JetStreamContext,
) -> None:
    status = await (await js.key_value("fleet-tickets")).status()
    assert status.ttl == 300.0  # the upper bound; each ticket's own expiry is checked first
