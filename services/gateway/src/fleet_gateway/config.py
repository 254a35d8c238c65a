"""The gateway's own settings, read once from `FLEET_GATEWAY_*` environment variables.

Where NATS is, this replica's name and the log level are every service's settings, read by
the runtime (`fleet_mesh.settings.MeshSettings`), not here.
"""

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events.subjects import SERVICES


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_GATEWAY_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # /ready must answer quickly even when a service is gone: every probe has its own deadline
    # and they all run at once, so the whole check takes about one timeout, not five.
    probe_timeout_s: float = Field(default=0.5, gt=0, le=10)
    services: tuple[str, ...] = SERVICES

    # Auth (docs/gateway.md). With neither a data dir nor an issuer, every /api route answers
    # 401: a gateway never falls back to "no auth".
    data_dir: Path | None = None
    """Where the development signing secret (generated on first run) and this replica's
    projection database live; `fleet up` sets it to `<data dir>/gateway`."""
    oidc_issuer: str = ""
    oidc_audience: str = ""
    oidc_jwks_url: str = ""
    """Defaults to `<issuer>/.well-known/jwks.json` when empty."""
    jwks_refetch_min_s: float = Field(default=10.0, ge=0, le=3600)
    """A token naming an unknown key refetches the JWKS at most this often, so a flood of
    made-up key ids cannot turn the gateway into a load generator against the issuer."""
    tenant_claim: str = "tid"
    user_claim: str = "sub"
    admin_claim: str = "fleet_admin"
    ticket_ttl_s: float = Field(default=60.0, gt=0, le=300)
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    tenant_rps: float = Field(default=50.0, gt=0)
    """Requests per second one tenant may make to one replica (a token bucket)."""
    tenant_burst: float = Field(default=100.0, ge=1)
    tenant_concurrent_turns: int = Field(default=8, ge=1)
    """Turns one tenant may have queued or running at once, across its sessions."""
    tenant_upload_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    """Bytes one tenant may upload (documents and checkouts, shared by every replica) per
    `tenant_upload_window_s`; the allowance refills evenly over the window."""
    tenant_upload_window_s: float = Field(default=3600.0, gt=0)
    api_token_max_ttl_s: float = Field(default=365 * 24 * 3600.0, gt=0)
    """The longest an API token (`POST /api/v1/auth/tokens`) may be issued for."""
    read_wait_max_s: float = Field(default=5.0, gt=0, le=60)
    """The longest a read with `min_seq` waits for this replica's projections to catch up."""
    ws_per_message_deflate: bool = False
    # seconds a client has to send a whole request head, from connecting or from the last
    # response (`slow_clients`): a slow-loris connection is dropped after it
    header_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Compress WebSocket frames (permessage-deflate) when a client offers it. Off: the
    deflate runs once per frame per socket (nothing is shared between sockets), which was
    half the gateway's send cost at 10 clients x 1,000 events/s (docs/websocket.md)."""
    ws_queue_limit: int = Field(default=1024, ge=1, le=100_000)
    """Frames one WebSocket may fall behind before it is closed with 4008 and the last
    sequence it was sent (never a silent drop: the client resumes from there)."""
