"""`archive` (the holding replica): the provider archives the sandbox (its files kept in the
provider's cold storage, nothing running) and this replica stops serving it; the log records
`sandbox.archived`. A provider that cannot (the local one: its files are this host's), or a
sandbox with children still running, is a well-formed request declined: `sandbox.archive_
refused` is recorded and the caller gets a `declined` error saying why and what to do."""

import msgspec

from fleet_events import sandbox as sb
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.broker import Broker, Held
from fleet_sandbox_broker.errors import SandboxError


class ArchiveDeclined(SandboxError):
    code = "declined"


class Archives:
    def __init__(self, broker: Broker) -> None:
        self.b = broker

    async def archive(self, req: sb.ArchiveSandbox) -> sb.SandboxInfo:
        held = self.b.get_held(req.tenant, req.sandbox)
        provider = self.b.provider_of(held)
        archive = getattr(held.box, "archive", None)
        problem = _refusal(held, provider.name, provider.capabilities.archive and archive)
        if problem is not None:
            refused = domain.archive_refused(held.box.id, provider.name, problem)
            await self.b.append(held.tenant, held.box.id, refused, held.labels)
            raise ArchiveDeclined(problem)
        assert archive is not None
        await archive()
        info = self.b.info(held)
        await self.b.release(held)
        done = domain.archived(held.box.id, provider.name, req.reason)
        await self.b.append(held.tenant, held.box.id, done, held.labels)
        return msgspec.structs.replace(info, status="stopped", stopped_reason="archived")


def _refusal(held: Held, provider: str, can: object) -> str | None:
    if not can:
        return (
            f"sandbox {held.box.id} runs on the {provider} provider, which cannot archive it "
            "(its files live on the broker's host): delete it instead, or give the tenant the "
            "daytona provider (setting sandbox_provider) for sandboxes that can be archived"
        )
    if held.children:
        return (
            f"sandbox {held.box.id} has {len(held.children)} child sandbox(es) running: archive "
            "it once they have ended (or delete them)"
        )
    return None
