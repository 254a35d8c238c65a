"""The gateway's own settings, read once from `FLEET_GATEWAY_*` environment variables.

Where NATS is, this replica's name and the log level are every service's settings, read by
the runtime (`fleet_mesh.settings.MeshSettings`), not here.
"""

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
