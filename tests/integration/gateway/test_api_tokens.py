"""API tokens on a real nats-server, two gateway replicas: issued on one, accepted on both,
revoked on one and refused by both from the next request; never shown after creation, stored
only as a hash; another tenant's or another user's token is 404 to revoke."""

import hashlib
from pathlib import Path

import msgspec
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import streams
from fleet_harness.waits import eventually
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer

TOKENS = "/api/v1/auth/tokens"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _me(api: Api, token: str) -> tuple[int, dict[str, object]]:
    response = await api.client.get("/api/v1/auth/me", headers=_bearer(token))
    body: dict[str, object] = response.json()
    return response.status_code, body


async def test_a_token_issued_on_one_replica_works_on_both_and_a_revoke_holds_on_both(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with (
        running_api(nats_server.url, tmp_path, replica="gateway-a") as a,
        running_api(nats_server.url, tmp_path, replica="gateway-b") as b,
    ):
        tenant = tenant_id()
        issued = await a.call("POST", TOKENS, tenant, "carol", json={"name": "ci", "ttl_s": 600})
        assert issued.status_code == 201, issued.text
        body = issued.json()
        token = body["token"]
        assert token.startswith(f"flt.{tenant}.{body['id']}.")
        assert (body["name"], body["user"], body["admin"]) == ("ci", "carol", False)
        for replica in (a, b):
            assert await _me(replica, token) == (
                200,
                {"tenant": tenant, "user": "carol", "admin": False},
            )

        # stored as a hash only: the bucket never holds the token or its secret
        kv = await js.key_value(streams.GATEWAY.bucket)
        entry = await kv.get(f"token.{tenant}.{body['id']}")
        stored = msgspec.json.decode(entry.value or b"")
        secret = token.rsplit(".", 1)[1]
        assert stored["sha256"] == hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in (entry.value or b"").decode()

        # listed on the other replica, without the token
        listed = await b.call("GET", TOKENS, tenant, "carol")
        assert listed.status_code == 200
        (item,) = listed.json()["items"]
        assert item["id"] == body["id"]
        assert "token" not in item
        assert "sha256" not in item
        assert secret not in listed.text

        revoked = await b.call("DELETE", f"{TOKENS}/{body['id']}", tenant, "carol")
        assert revoked.status_code == 200, revoked.text
        for replica in (a, b):
            status, refusal = await _me(replica, token)
            assert status == 401
            assert refusal["code"] == "invalid_token"
            assert "unknown or revoked" in str(refusal["message"])
        assert (await a.call("GET", TOKENS, tenant, "carol")).json()["items"] == []
        again = await a.call("DELETE", f"{TOKENS}/{body['id']}", tenant, "carol")
        assert again.status_code == 404


async def test_another_tenants_or_users_token_is_404_and_stays_valid(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path) as api:
        tenant, other = tenant_id(), tenant_id()
        body = (await api.call("POST", TOKENS, tenant, "carol", json={"name": "x"})).json()
        for who, user in ((other, "carol"), (tenant, "mallory")):
            response = await api.call("DELETE", f"{TOKENS}/{body['id']}", who, user)
            assert response.status_code == 404, (who, user, response.text)
            assert response.json()["code"] == "token_not_found"
            assert (await api.call("GET", TOKENS, who, user)).json()["items"] == []
        assert (await _me(api, body["token"]))[0] == 200
        # an admin of the tenant sees and may revoke any user's token
        admin = {"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"}
        listed = await api.client.get(TOKENS, headers=admin)
        assert [t["id"] for t in listed.json()["items"]] == [body["id"]]
        revoked = await api.client.delete(f"{TOKENS}/{body['id']}", headers=admin)
        assert revoked.status_code == 200
        assert (await _me(api, body["token"]))[0] == 401


async def test_a_forged_secret_a_made_up_id_and_an_admin_ask_by_a_non_admin_are_refused(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path, api_token_max_ttl_s=3600) as api:
        tenant = tenant_id()
        body = (await api.call("POST", TOKENS, tenant, json={"name": "x", "ttl_s": 60})).json()
        prefix, secret = body["token"].rsplit(".", 1)
        forged = prefix + "." + ("A" if secret[0] != "A" else "B") + secret[1:]
        elsewhere = body["token"].replace(f"flt.{tenant}.", f"flt.{tenant_id()}.")
        for token in (forged, elsewhere, f"flt.{tenant}.nope.{secret}", "flt.x"):
            status, refusal = await _me(api, token)
            assert (status, refusal["code"]) == (401, "invalid_token"), token
        admin = await api.call(
            "POST", TOKENS, tenant, json={"name": "x", "admin": True, "ttl_s": 60}
        )
        assert admin.status_code == 403
        assert admin.json()["code"] == "admin_required"
        long = await api.call("POST", TOKENS, tenant, json={"name": "x", "ttl_s": 7200})
        assert long.status_code == 422
        assert "'ttl_s'" in long.json()["message"]
        assert "3600" in long.json()["message"]
        extra = await api.call("POST", TOKENS, tenant, json={"name": "x", "tenant": "other"})
        assert extra.status_code == 422
        # an admin's admin token is an admin
        root = {"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"}
        made = await api.client.post(
            TOKENS, headers=root, json={"name": "ops", "admin": True, "ttl_s": 60}
        )
        assert made.status_code == 201
        assert await _me(api, made.json()["token"]) == (
            200,
            {"tenant": tenant, "user": "root", "admin": True},
        )


async def test_an_expired_token_is_refused_saying_so(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path) as api:
        tenant = tenant_id()
        body = (await api.call("POST", TOKENS, tenant, json={"name": "x", "ttl_s": 1})).json()
        kv = await js.key_value(streams.GATEWAY.bucket)
        key = f"token.{tenant}.{body['id']}"
        stored = msgspec.json.decode((await kv.get(key)).value or b"")
        stored["expires_at"] = stored["created_at"] - 1  # as if its second had passed
        await kv.put(key, msgspec.json.encode(stored))
        status, refusal = await _me(api, body["token"])
        assert status == 401
        assert "has expired" in str(refusal["message"])


async def test_a_token_store_that_does_not_answer_is_503_not_a_server_error(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    """NATS gone under the gateway: an API token cannot be checked, which is the mesh's
    trouble (503 auth_unavailable, retry), never a 500 and never a pass."""
    nc = await connect(private_nats.url, name="bootstrap")
    await bootstrap(nc.jetstream(), env={})
    await nc.close()
    async with running_api(private_nats.url, tmp_path) as api:
        tenant = tenant_id()
        token = (await api.call("POST", TOKENS, tenant, json={"name": "x"})).json()["token"]
        private_nats.stop()
        response = await api.client.get("/api/v1/auth/me", headers=_bearer(token))
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "auth_unavailable"
        assert response.headers["Retry-After"] == "1"
        private_nats.start()  # back, so the gateway's runtime drains and stops cleanly
        await eventually(lambda: api.state.nc is not None and api.state.nc.is_connected,
                         timeout=30, what="the gateway to reconnect")  # fmt: skip
        assert (await api.client.get("/api/v1/auth/me", headers=_bearer(token))).status_code == 200
