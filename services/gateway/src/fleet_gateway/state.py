"""What one gateway replica holds while it runs: its settings, its bus connection and the
handles `components.attach` opens once the mesh is there. Its own module, so the composition
root (`app`), the components and the routes all read it without importing each other."""

from dataclasses import dataclass, field

from nats.aio.client import Client

from fleet_gateway.api_tokens import ApiTokens
from fleet_gateway.auth import Authenticator
from fleet_gateway.config import GatewaySettings
from fleet_gateway.projections import ProjectionStore, Projector
from fleet_gateway.quotas import UploadQuota
from fleet_gateway.sessionlog import SessionLog
from fleet_gateway.sessions.commands import SessionCommands
from fleet_gateway.tickets import Tickets
from fleet_mesh.store import EventStore


@dataclass
class GatewayState:
    settings: GatewaySettings
    replica: str
    nc: Client | None = None
    # Set by `components.attach` once on the bus: the authenticator, ticket bucket, event
    # store, this replica's read models and their projector.
    auth: Authenticator | None = None
    tickets: Tickets | None = None
    store: EventStore | None = None
    projections: ProjectionStore | None = None
    projector: Projector | None = None
    log: SessionLog | None = None
    commands: SessionCommands | None = None
    """The session commands every door calls (REST routes, WebSocket frames)."""
    api_tokens: ApiTokens | None = None
    uploads: UploadQuota | None = None
    body_limits: dict[str, int] = field(default_factory=dict)
    """Path prefix → body limit for routes that take more than `max_body_bytes` (uploads)."""

    def body_limit_for(self, path: str) -> int:
        for prefix, limit in self.body_limits.items():
            if path.startswith(prefix) or _segments_match(prefix, path):
                return limit
        return self.settings.max_body_bytes


def _segments_match(pattern: str, path: str) -> bool:
    """`/api/v1/sessions/*/documents` matches one id where the `*` is (upload routes whose
    path carries the session)."""
    want, got = pattern.split("/"), path.rstrip("/").split("/")
    return len(want) == len(got) and all(w in ("*", g) for w, g in zip(want, got, strict=True))
