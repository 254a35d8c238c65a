"""An in-process gateway on the test's real nats-server for the HTTP API tests: the app
`create_app` builds for any ASGI host, its lifespan (the service runtime, the projector) run in
the test's loop, and an httpx client over ASGI. Tokens are minted with the gateway's own
secret from its data dir, as `fleet up`'s development token is."""

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from fleet_events import new_id
from fleet_gateway.app import GatewayState, create_app
from fleet_gateway.config import GatewaySettings
from fleet_mesh.tokens import issue_token, signing_secret


@dataclass
class Api:
    app: FastAPI
    client: httpx.AsyncClient
    data_dir: Path
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def state(self) -> GatewayState:
        state: GatewayState = self.app.state.gateway
        return state

    def token(self, tenant: str, user: str = "alice", *, admin: bool = False) -> str:
        return issue_token(signing_secret(self.data_dir), tenant=tenant, user=user, admin=admin)

    def auth(self, tenant: str, user: str = "alice") -> dict[str, str]:
        key = (tenant, user)
        if key not in self.tokens:
            self.tokens[key] = self.token(tenant, user)
        return {"Authorization": f"Bearer {self.tokens[key]}"}

    async def call(
        self, method: str, path: str, tenant: str, user: str = "alice", **kwargs: Any
    ) -> httpx.Response:
        headers = {**self.auth(tenant, user), **kwargs.pop("headers", {})}
        return await self.client.request(method, path, headers=headers, **kwargs)


def tenant_id() -> str:
    return "t" + new_id()[:12]


@contextlib.asynccontextmanager
async def running_api(
    nats_url: str, data_dir: Path, *, replica: str | None = None, **settings: Any
) -> AsyncIterator[Api]:
    app = create_app(
        GatewaySettings(data_dir=data_dir, **settings),
        replica=replica or f"gateway-test-{new_id()[:6]}",
        nats_url=nats_url,
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield Api(app=app, client=client, data_dir=data_dir)
