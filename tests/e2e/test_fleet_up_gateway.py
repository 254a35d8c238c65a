"""`fleet up` prints the URL and a development token; that token opens the API, and a turn
asked through the gateway's routes is answered by the mesh (the agent's default runner)."""

import re

import httpx
import pytest

from fleet_harness.waits import eventually

from .conftest import StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
TOKEN = re.compile(r"development token \(tenant dev, admin, 30 days\): (\S+)")


async def test_the_printed_token_opens_the_api_and_a_turn_is_answered(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()
    found = await eventually(lambda: TOKEN.search(mesh.printed()), timeout=90, what="the token")
    assert f"fleet is ready: {mesh.gateway}" in mesh.printed()
    headers = {"Authorization": f"Bearer {found.group(1)}"}
    async with httpx.AsyncClient(base_url=mesh.gateway, headers=headers, timeout=30) as client:
        me = await client.get("/api/v1/auth/me")
        assert me.json() == {"tenant": "dev", "user": "dev", "admin": True}
        session = (await client.post("/api/v1/sessions", json={"title": "e2e"})).json()
        sid = session["session"]["id"]
        asked = await client.post(f"/api/v1/sessions/{sid}/turns", json={"message": "echo me"})
        assert asked.status_code == 202

        async def answered() -> dict[str, object] | None:
            turns = (await client.get(f"/api/v1/sessions/{sid}/turns")).json()["items"]
            return turns[0] if turns and turns[0]["status"] == "completed" else None

        turn = await eventually(answered, timeout=60, what="the turn answered")
        assert turn["id"] == asked.json()["turn"]
        assert turn["assistant_message"]
    async with httpx.AsyncClient(base_url=mesh.gateway, timeout=30) as anonymous:
        assert (await anonymous.get("/api/v1/auth/me")).status_code == 401
