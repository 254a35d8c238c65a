"""What one broker replica holds, and the one path every sandbox of it starts by.

The verbs are served by `sandboxes.py` (lifecycle), `repl.py` (contexts and cells) and
`files.py` (workspace files and volumes), each over this core; `lifecycle.py` revives and reaps
at start; `subscribers.py` is the bus. Events are built in `domain.py`; this module appends
them, one writer per sandbox subject.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.codec import BlobStore
from fleet_events.config import global_key, tenant_key
from fleet_events.envelope import Envelope, Event, new_id, utc_now
from fleet_mesh import rpc
from fleet_mesh.decider import Decider, Ledger, Request
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.service import ServiceContext
from fleet_mesh.store import EventStore, StoredEvent
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.config import BrokerSettings
from fleet_sandbox_broker.errors import ProviderNotConfigured, QuotaExceeded, SandboxNotFound
from fleet_sandbox_broker.pool import WarmPool
from fleet_sandbox_broker.providers.base import Provider, Sandbox
from fleet_sandbox_broker.view import SandboxesView
from fleet_sandbox_broker.volumes import Volumes


@dataclass
class Held:
    """A sandbox this replica holds."""

    tenant: str
    box: Sandbox
    labels: dict[str, str]
    parent: str | None = None
    spec: domain.Spec = field(default_factory=domain.Spec)
    interpreters: dict[str, str | None] = field(default_factory=dict)
    children: set[str] = field(default_factory=set)
    served: list[rpc.Served] = field(default_factory=list)  # its subjects (subscribers.py)
    provider: str = ""  # the provider it runs on ("" is the broker's default)


def _fold_log(log: domain.SandboxLog, stored: StoredEvent) -> domain.SandboxLog:
    return domain.evolve_log(log, stored.seq)


SANDBOX_LOGS = Ledger(
    name="broker-sandbox-log", initial=domain.SandboxLog, evolve=_fold_log,
    clone=lambda log: domain.SandboxLog(log.seq),
)  # fmt: skip
"""Where each sandbox's subject ends; `max_batch=1`: a claim is decided on a stored position,
never on one a group commit has not stored yet."""

CACHED_LOGS = 4096

# what a started sandbox records first: `sandbox.created`, or `sandbox.replaced` for a revival
FirstEvent = Callable[[Sandbox], Event]


class Broker:
    def __init__(
        self,
        ctx: ServiceContext,
        provider: Provider,
        store: EventStore,
        blobs: BlobStore,
        settings: BrokerSettings,
        config: RuntimeConfig,
        view: SandboxesView,
        sessions: EventStore | None = None,
        providers: dict[str, Provider] | None = None,
    ) -> None:
        self.ctx = ctx
        # `provider` is the warm pool's and the fallback; `providers` every one this broker was
        # configured for, by name: a tenant's `sandbox_provider` setting picks among them
        self.provider = provider
        self.providers: dict[str, Provider] = {provider.name: provider, **(providers or {})}
        self._config_kv: KeyValue | None = None
        # per tenant: when a create refusal was last recorded, and how many were answered since
        self._refusals: dict[str, tuple[float | None, int]] = {}
        self.store = store
        self.blobs = blobs
        self.settings = settings
        self.config = config
        self.view = view
        self.volumes = Volumes(settings.volumes)
        self.sessions: EventStore | None = sessions
        self.pool = WarmPool(provider, settings.pool_size, settings.default_limits())
        self.held: dict[str, Held] = {}
        # one writer per sandbox subject: its folds (where each ends) and its appends
        self._logs = Decider(store, SANDBOX_LOGS, capacity=CACHED_LOGS, max_batch=1)
        self._starting: dict[str, int] = {}  # per tenant: sandboxes started, not yet in the view
        self._closing = False
        # set by the routes (subscribers.py): serve / stop serving one held sandbox's subjects
        self.on_adopt: Callable[[Held], Awaitable[None]] | None = None
        self.on_release: Callable[[Held], Awaitable[None]] | None = None

    # -- the log -------------------------------------------------------------------------------

    def _envelope(self, tenant: str, event: Event, labels: dict[str, str]) -> Envelope[Event]:
        return Envelope(
            id=new_id(), tenant=tenant, actor=self.ctx.actor, ts=utc_now(), data=event,
            session=labels.get("session"), run=labels.get("run"),
        )  # fmt: skip

    async def _decide(
        self, tenant: str, sandbox: str, command: domain.Record | domain.Claim,
        labels: dict[str, str],
    ) -> int | None:  # fmt: skip
        """`domain.decide` on the sandbox's subject, by the decider kernel (which serialises
        this replica's writes per subject and re-decides when the subject moved): the stream
        sequence of what was recorded, None when nothing was."""
        _, placed = await self._logs.place(
            sb.sandbox_subject(tenant, sandbox),
            Request(
                None,
                lambda log: domain.decide(log, command),
                lambda _, event: self._envelope(tenant, event, labels),
            ),
        )
        return placed[-1].seq if placed else None

    async def append(self, tenant: str, sandbox: str, event: Event, labels: dict[str, str]) -> int:
        """Record as the sandbox's one writer (this replica); returns the stream sequence."""
        seq = await self._decide(tenant, sandbox, domain.Record(event), labels)
        assert seq is not None  # a record always stores its event
        return seq

    async def claim(self, view: domain.SandboxView, event: Event) -> bool:
        """Record `event` only if the sandbox's subject is still where the view saw it: of two
        replicas taking over one sandbox, exactly one wins; False for the loser."""
        head = self.view.head(view.tenant, view.sandbox)
        seen = head.seq if head is not None else None
        command = domain.Claim(seen, event)
        return await self._decide(view.tenant, view.sandbox, command, view.labels) is not None

    # -- which provider ---------------------------------------------------------------------------

    async def provider_for(self, tenant: str) -> Provider:
        """The tenant's provider (`sandbox_provider`: tenant over global, else this broker's
        FLEET_SANDBOX_PROVIDER), or a refusal naming what to set when it has no such one."""
        stored = await self._stored_provider(tenant)
        name, where = stored or (self.settings.provider, "the broker's FLEET_SANDBOX_PROVIDER")
        found = self.providers.get(name)
        if found is None:
            raise ProviderNotConfigured(
                f"tenant {tenant!r} has sandbox_provider={name!r} ({where}), but this sandbox "
                f"broker has no {name} provider: set DAYTONA_API_KEY, DAYTONA_API_URL and "
                "DAYTONA_TARGET on the broker, or set sandbox_provider (the tenant's, or the "
                f"global one) to one of {', '.join(sorted(self.providers))}",
                name,
            )
        return found

    async def _stored_provider(self, tenant: str) -> tuple[str, str] | None:
        """The `sandbox_provider` the config KV holds for the tenant, else globally, and where
        it was found; None when neither is set (`RuntimeConfig.get` would answer the built-in
        default, hiding that nothing is set)."""
        if self._config_kv is None:
            self._config_kv = await self.ctx.js.key_value(streams.CONFIG.bucket)
        for key, where in (
            (tenant_key(tenant, "sandbox_provider"), "the tenant's setting"),
            (global_key("sandbox_provider"), "the global setting"),
        ):
            try:
                entry = await self._config_kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                return entry.value.decode(), where
        return None

    def provider_of(self, held: "Held | domain.SandboxView") -> Provider:
        """The provider a sandbox runs on (a view names it; "" or unknown: the default)."""
        return self.providers.get(held.provider, self.provider)

    async def refuse_create(
        self, tenant: str, labels: dict[str, str], refused: ProviderNotConfigured
    ) -> None:
        """Record a create the deployment declined, on the subject the sandbox would have had:
        the first, then at most one per `refusal_record_s` per tenant (counting those between),
        so a tenant that keeps asking cannot grow the log without bound."""
        now = time.monotonic()
        last, unrecorded = self._refusals.get(tenant, (None, 0))
        if last is not None and now - last < self.settings.refusal_record_s:
            self._refusals[tenant] = (last, unrecorded + 1)
            self.ctx.log.warning(
                "sandbox create refused; recorded once per interval",
                extra={"tenant": tenant, "provider": refused.provider},
            )
            return
        self._refusals[tenant] = (now, 0)
        sandbox = new_id()
        event = domain.create_refused(
            sandbox, refused.provider, refused.message, labels, unrecorded
        )
        await self.append(tenant, sandbox, event, labels)

    # -- what this replica holds ----------------------------------------------------------------

    def get_held(self, tenant: str, sandbox: str) -> Held:
        held = self.held.get(sandbox)
        if held is None or held.tenant != tenant:
            raise SandboxNotFound(f"no sandbox {sandbox!r} for tenant {tenant!r} on this replica")
        return held

    def info(self, held: Held) -> sb.SandboxInfo:
        box, provider = held.box, self.provider_of(held)
        return sb.SandboxInfo(
            sandbox=box.id, tenant=held.tenant, provider=provider.name,
            replica=self.ctx.replica, status="running" if box.running else "stopped",
            workspace=str(box.workspace), parent=held.parent, labels=held.labels,
            contexts=sorted(box.contexts), stopped_reason=box.stopped_reason, pid=box.pid,
            uid=box.uid, capabilities=provider.capabilities, volume=held.spec.volume,
            volume_subpath=held.spec.volume_subpath, repo_url=held.spec.repo_url,
            ref=held.spec.ref, context_paths=list(held.spec.context_paths),
        )  # fmt: skip

    async def adopt(self, tenant: str, box: Sandbox, labels: dict[str, str],
                    parent: str | None, spec: domain.Spec, provider: str = "") -> Held:  # fmt: skip
        held = Held(tenant, box, labels, parent, spec, provider=provider or self.provider.name)
        await box.bind_tenant(tenant)  # its tasks count against its tenant's bound from now
        self.held[box.id] = held
        box.on_stop.append(lambda stopped: self._on_stop(stopped, held))
        box.on_full.append(lambda full, limit, detail: self._on_full(full, held, limit, detail))
        if self.on_adopt is not None:
            await self.on_adopt(held)
        return held

    async def _on_stop(self, box: Sandbox, held: Held) -> None:
        event = domain.stopped(box.id, box.stopped_limit, box.stopped_reason)
        if self._closing or event is None:
            return
        try:
            await self.append(held.tenant, box.id, event, held.labels)
        except Exception:
            self.ctx.log.exception("could not record a sandbox stop", extra={"sandbox": box.id})

    async def _on_full(self, box: Sandbox, held: Held, limit: str, detail: str) -> None:
        if self._closing:
            return
        event = sb.DiskFull(sandbox=box.id, limit=limit, detail=detail)  # type: ignore[arg-type]
        try:
            await self.append(held.tenant, box.id, event, held.labels)
        except Exception:
            self.ctx.log.exception("could not record a full disk", extra={"sandbox": box.id})

    # -- the quota ------------------------------------------------------------------------------

    async def reserve(self, tenant: str) -> None:
        """Count one more live sandbox for `tenant` or refuse: the view of every replica's
        sandboxes, plus those this replica is starting and the view has not seen yet."""
        await self.view.caught_up()
        live = self.view.live(tenant) + self._starting.get(tenant, 0)
        problem = domain.quota_problem(tenant, live, self.settings.tenant_quota)
        if problem is not None:
            self.ctx.log.warning("sandbox quota reached", extra={"tenant": tenant, "live": live})
            raise QuotaExceeded(problem)
        self._starting[tenant] = self._starting.get(tenant, 0) + 1

    def unreserve(self, tenant: str) -> None:
        left = self._starting.get(tenant, 0) - 1
        if left > 0:
            self._starting[tenant] = left
        else:
            self._starting.pop(tenant, None)

    async def counted(self, tenant: str, seq: int) -> None:
        """The view now counts the sandbox whose first event is at `seq`: drop its reservation
        (bounded: a lagging view means a brief over-count, never an under-count)."""
        try:
            await self.view.reached(seq)
        except Exception:
            self.ctx.log.warning("the sandboxes view lags", extra={"seq": seq})
        finally:
            self.unreserve(tenant)

    # -- the start path: create, clean children, replacements and revivals all come here ----

    async def start_box(
        self,
        tenant: str,
        labels: dict[str, str],
        limits: sb.Limits | None,
        spec: domain.Spec,
        *,
        first: FirstEvent | None = None,
        fork_ready: bool = True,
        files: dict[str, bytes] | None = None,
        sandbox: str | None = None,
        parent: str | None = None,
        revive: bool = False,
        provider: Provider | None = None,
    ) -> Held:
        """Start a sandbox (from the warm pool when nothing about it is special), adopt it and
        record its first event (`sandbox.created` unless `first` says otherwise), counted
        against the tenant's quota. `revive`: the sandbox `sandbox` again, on its own files,
        already claimed and counted (lifecycle.py), so nothing is recorded or reserved here.
        `provider`: where it runs (a revival's own); None is the tenant's `sandbox_provider`."""
        if provider is None:
            provider = await self.provider_for(tenant)
        if not revive:
            await self.reserve(tenant)
        try:
            held = await self._start(
                tenant, labels, limits, spec, fork_ready=fork_ready, files=files,
                sandbox=sandbox, parent=parent, revive=revive, provider=provider,
            )  # fmt: skip
        except BaseException:
            if not revive:
                self.unreserve(tenant)
            raise
        if revive:
            return held
        box = held.box
        event = first(box) if first is not None else domain.created(
            box.id, provider.name, self.ctx.replica, str(box.workspace), labels,
            box.limits, spec,
        )  # fmt: skip
        await self.counted(tenant, await self.append(tenant, box.id, event, labels))
        return held

    async def _start(
        self, tenant: str, labels: dict[str, str], limits: sb.Limits | None, spec: domain.Spec,
        *, fork_ready: bool, files: dict[str, bytes] | None, sandbox: str | None,
        parent: str | None, revive: bool, provider: Provider,
    ) -> Held:  # fmt: skip
        box = None
        plain = spec.volume is None and spec.repo_url is None and limits is None
        if plain and fork_ready and sandbox is None and provider is self.pool.provider:
            box = self.pool.take()
        limits = limits or self.settings.default_limits()
        if box is None:
            mounts: dict[str, Path] = {}
            # a provider with volumes of its own (Daytona) names them; else a host directory
            remote: Callable[[str, str, str | None], Path] | None = getattr(
                provider, "volume_mount", None
            )
            if spec.volume is not None and remote is not None:
                mounts["volume"] = remote(tenant, spec.volume, spec.volume_subpath)
            elif spec.volume is not None:
                mounts["volume"] = await asyncio.to_thread(
                    self.volumes.prepare, tenant, spec.volume, spec.volume_subpath
                )
            box = await provider.create(
                sandbox or new_id(), limits, fork_ready=fork_ready, mounts=mounts, revive=revive
            )
        try:
            if spec.volume is not None and box.uid is not None:
                await asyncio.to_thread(
                    self.volumes.ensure, tenant, spec.volume, spec.volume_subpath, box.uid
                )
            if spec.repo_url is not None and not revive:
                await provider.clone_repo(
                    box, spec.repo_url, spec.ref, allow_local=self.settings.allow_local_repos
                )
            for name, data in (files or {}).items():
                await box.write_file(name, data)
        except BaseException:
            await box.destroy()
            raise
        return await self.adopt(tenant, box, labels, parent, spec, provider.name)

    async def fork_box(self, parent: Held, labels: dict[str, str]) -> Held:
        child_id = new_id()
        provider = self.provider_of(parent)  # a fork stays on its parent's provider
        await self.reserve(parent.tenant)
        try:
            box = await provider.fork(parent.box, child_id)
        except BaseException:
            self.unreserve(parent.tenant)
            raise
        labels = {**labels, "parent": parent.box.id}
        held = await self.adopt(
            parent.tenant, box, labels, parent.box.id, domain.Spec(), provider.name
        )
        held.interpreters = dict.fromkeys(parent.interpreters)
        parent.children.add(child_id)
        event = domain.forked(
            child_id, parent.box.id, provider.name, self.ctx.replica, str(box.workspace),
            labels, box.limits,
        )  # fmt: skip
        await self.counted(parent.tenant, await self.append(parent.tenant, child_id, event, labels))
        return held

    async def release(self, held: Held) -> None:
        """Stop serving a sandbox whose provider keeps it (archived), without touching it."""
        if self.on_release is not None:
            await self.on_release(held)
        self.held.pop(held.box.id, None)
        if held.parent in self.held:
            self.held[held.parent].children.discard(held.box.id)

    async def remove(self, held: Held, reason: str) -> None:
        """Stop a held sandbox (its children first), remove its files, record it deleted."""
        box = held.box
        for child in sorted(held.children):
            if child in self.held:
                await self.remove(self.held[child], f"parent {box.id} deleted")
        await box.destroy()
        if self.on_release is not None:
            await self.on_release(held)
        self.held.pop(box.id, None)
        if held.parent in self.held:
            self.held[held.parent].children.discard(box.id)
        await self.append(held.tenant, box.id, domain.deleted(box.id, reason), held.labels)

    async def close(self) -> None:
        """Stop every sandbox at once and record nothing: NATS may already be gone, and the
        log rightly still shows them, so a restart under this name reaps or revives them."""
        self._closing = True
        await self.pool.close()
        await asyncio.gather(
            *(held.box.stop("the broker stopped", "exited") for held in self.held.values()),
            return_exceptions=True,
        )
        await self.view.close()
