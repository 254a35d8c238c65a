"""The session commands, whichever door they come through: each takes the caller's tenant
(from its token or ticket, never its input), decides from the session's own log (folded by
`fleet_events.session_fold`, the agent's fold too), appends through the one writer
(`sessionlog.append_event`) and answers where the event was stored. Refusals are the domain
errors of `sessions.errors`.

A turn request may carry an idempotency key (`Idempotency-Key` on REST, the frame's `id` on
the socket): its event id and turn id are hashes of (tenant, session, key), so the key is
scoped to the session and a retry, answered from the fold, returns the first answer however
long ago it came; a different body under it is `KeyReused`; a retry while the first is still
being written on this replica is `KeyInFlight` (two replicas racing one key write one event:
the same id and the same turn, and the loser re-folds and answers the winner's).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from fleet_events import new_id
from fleet_events.addresses import AddressRefused
from fleet_events.session import (
    CancelRequested,
    InputProvided,
    PurgeReceipt,
    SessionCreated,
    SessionDeleted,
    SessionRenamed,
    TurnRequested,
)
from fleet_events.session_fold import (
    AskedTurn,
    SessionState,
    active_turn,
    asked_turn,
    earlier_request,
    missing_documents,
)
from fleet_gateway.sessionlog import Appended, SessionLog, append_event, folded
from fleet_gateway.sessions.errors import (
    AdminRequired,
    DocumentsMissing,
    KeyInFlight,
    KeyReused,
    NoActiveTurn,
    RepositoryNotPublic,
    SessionIsDeleted,
    SessionNotDeleted,
    SessionNotFound,
    TurnNotFound,
    TurnsOverQuota,
)
from fleet_gateway.sessions.keys import check_key, key_event_id, key_turn_id
from fleet_gateway.sessions.purge import purge_session
from fleet_mesh import egress
from fleet_mesh.store import EMPTY


@dataclass(frozen=True, slots=True)
class Written:
    seq: int
    """Where the event was stored: a read passes it as `min_seq`."""
    first_seq: int
    """The first event this command wrote (`SessionCreated` when it opened the session)."""


@dataclass(frozen=True, slots=True)
class TurnAnswer:
    session: str
    turn: str
    seq: int
    first_seq: int
    repeated: bool = False
    """A retry under a known key: nothing was written, this is the first request's answer."""


@dataclass
class SessionCommands:
    """One replica's session commands. `active_turns(tenant)` counts the tenant's queued and
    running turns (the read models'), for the per-tenant quota."""

    log: SessionLog
    active_turns: Callable[[str], int]
    turn_limit: int
    _in_flight: set[tuple[str, str, str]] = field(default_factory=set)

    async def create(self, tenant: str, owner: str, title: str) -> tuple[str, Appended]:
        session = new_id()
        created = SessionCreated(title=title, owner=owner)
        return session, await self.log.append(tenant, session, created, new_session=True)

    async def _live(self, tenant: str, session: str) -> SessionState:
        state, head = await folded(self.log.store, tenant, session)
        if head == EMPTY:
            raise SessionNotFound(session)
        if state.deleted:
            raise SessionIsDeleted(session)
        return state

    async def rename(self, tenant: str, session: str, title: str) -> Written:
        await self._live(tenant, session)
        done = await self.log.append(tenant, session, SessionRenamed(title=title))
        return Written(done.seq, done.first_seq)

    async def delete(self, tenant: str, session: str, reason: str) -> Written:
        """A tombstone (`session.deleted`): the log stays; a purge is another command."""
        await self._live(tenant, session)
        done = await self.log.append(tenant, session, SessionDeleted(reason=reason))
        return Written(done.seq, done.first_seq)

    async def request_turn(
        self, tenant: str, session: str, request: TurnRequested, *, key: str | None = None,
        key_field: str = "Idempotency-Key header", create: bool = False,
    ) -> TurnAnswer:  # fmt: skip
        """Append `turn.requested` (the agent's dispatcher admits or refuses it); `create`
        opens a session with no log yet (the socket's `message` to a new id)."""
        active = self.active_turns(tenant)
        if active >= self.turn_limit:
            raise TurnsOverQuota(tenant, active, self.turn_limit)
        await _public_repository(request.repo_url)
        if key is None:
            return await self._request(tenant, session, request, new_id(), new_id(), None, create)
        check_key(key, key_field)
        event_id = key_event_id(tenant, session, key)
        flight = (tenant, session, event_id)
        if flight in self._in_flight:
            raise KeyInFlight(key)
        self._in_flight.add(flight)
        try:
            turn = key_turn_id(tenant, session, key)
            return await self._request(tenant, session, request, event_id, turn, key, create)
        finally:
            self._in_flight.discard(flight)

    async def _request(
        self, tenant: str, session: str, request: TurnRequested, event_id: str, turn: str,
        key: str | None, create: bool,
    ) -> TurnAnswer:  # fmt: skip
        def check(state: SessionState) -> AskedTurn | None:
            earlier = earlier_request(state, event_id, request)
            if earlier is not None:
                asked, same = earlier
                if not same:
                    raise KeyReused(key or event_id, asked.turn)
                return asked
            missing = missing_documents(state, request.document_ids)
            if missing:
                loaded = [d.alias for d in state.image.documents]
                raise DocumentsMissing(session, missing, loaded)
            return None

        done = await append_event(
            self.log.store, self.log.actor, tenant, session, request, turn=turn,
            event_id=event_id, create=create, check=check,
        )  # fmt: skip
        if isinstance(done, AskedTurn):
            return TurnAnswer(session, done.turn, done.seq, done.seq, repeated=True)
        return TurnAnswer(session, turn, done.seq, done.first_seq)

    async def cancel(self, tenant: str, session: str, turn: str | None, reason: str) -> TurnAnswer:
        """Ask the turn (default: the latest one not ended) to stop: `CancelRequested`."""
        state, head = await folded(self.log.store, tenant, session)
        if head == EMPTY:
            raise SessionNotFound(session)
        target = turn or active_turn(state)
        if target is None:
            raise NoActiveTurn(session)
        if not asked_turn(state, target):
            raise TurnNotFound(target)
        done = await self.log.append(tenant, session, CancelRequested(reason=reason), turn=target)
        return TurnAnswer(session, target, done.seq, done.first_seq)

    async def answer(
        self, tenant: str, session: str, provided: InputProvided, turn: str | None
    ) -> Written:
        """A user's answer to a clarification (`InputProvided`); the agent decides whether it
        fits the pending question (`input.refused` when it does not)."""
        done = await self.log.append(tenant, session, provided, turn=turn)
        return Written(done.seq, done.first_seq)

    async def purge(
        self, tenant: str, session: str, *, by: str, admin: bool, reason: str
    ) -> tuple[PurgeReceipt, int]:
        """Remove a deleted session's events for good, behind the checkpointer's signed
        receipt (`purge.purge_session`); answers the receipt and the marker's sequence."""
        state, head = await folded(self.log.store, tenant, session)
        if head == EMPTY:
            raise SessionNotFound(session)  # unknown or foreign, before saying anything else
        if not admin:
            raise AdminRequired()
        if not state.deleted:
            raise SessionNotDeleted(session)
        return await purge_session(self.log, tenant, session, by=by, reason=reason)


async def _public_repository(url: str | None) -> None:
    """A remote `repo_url`'s host judged by the broker's own rule (`egress.arepository`), so a
    turn the checkout would refuse is refused before it is stored; the broker judges it again
    when it clones (a name can change its answer)."""
    if url is None:
        return
    try:
        await egress.arepository(url)
    except AddressRefused as exc:
        raise RepositoryNotPublic(str(exc)) from None
