"""The gateway's settings, read once from the environment (`FLEET_GATEWAY_*`, and `NATS_URL`)."""

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events.subjects import SERVICES
from fleet_mesh.connection import DEFAULT_URL


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_GATEWAY_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    nats_url: str = Field(
        default=DEFAULT_URL, validation_alias=AliasChoices("NATS_URL", "FLEET_GATEWAY_NATS_URL")
    )
    # /ready must answer quickly even when a service is gone: every probe has its own deadline
    # and they all run at once, so the whole check takes about one timeout, not five.
    probe_timeout_s: float = Field(default=0.5, gt=0, le=10)
    services: tuple[str, ...] = SERVICES
