"""`POST /api/v1/sessions/{id}/purge`: an admin removes a deleted session's events for good,
behind the checkpointer's signed receipt (the session command `purge`; see
`fleet_gateway.sessions.purge`)."""

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.errors import ErrorBody
from fleet_gateway.routes.common import Strict
from fleet_gateway.routes.session_reads import (
    ERRORS,
    PREFIX,
    SessionId,
    Written,
    commands,
    session_row,
)
from fleet_gateway.sessionlog import log_head

router = APIRouter(prefix=PREFIX, tags=["sessions"], responses=ERRORS)


class PurgeSession(Strict):
    reason: str = Field(default="", max_length=500)


class PurgedSession(Written):
    session: str
    receipt: int
    """The number of the signed checkpoint that is the receipt."""
    digest: str
    key: str
    """The id of the checkpoint key that signed it."""
    purged: dict[str, tuple[int, str]]
    """Each purged subject's last sequence and hash, as the receipt pins them."""


PURGE_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "the caller is not an admin"},
    409: {"model": ErrorBody, "description": "the session is not deleted"},
    503: {"model": ErrorBody, "description": "no checkpointer answers"},
    504: {"model": ErrorBody, "description": "the checkpointer did not answer in time"},
}


@router.post("/{session_id}/purge", response_model=PurgedSession, responses=PURGE_ERRORS)
async def purge_session(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    body: PurgeSession | None = None,
) -> PurgedSession:
    """Remove a deleted session's events (its log and every run) for good, behind a receipt:
    the checkpointer (the one process holding the checkpoint key) checkpoints what is there,
    signs a checkpoint naming each subject's last sequence and hash, and only then purges, so
    an auditor's verification against the checkpoints still passes and names the receipt.
    Admins only; the session must be deleted first. `session.purged` then records the receipt
    on the session's `.run.purge` subject and every replica drops the session's rows."""
    body = body or PurgeSession()
    run = commands(request)
    head = await log_head(run.log.store, principal.tenant, session_id)  # unknown or foreign
    await session_row(request, principal.tenant, session_id, head.seq)  # folded to its head
    receipt, seq = await run.purge(
        principal.tenant, session_id, by=principal.user, admin=principal.admin,
        reason=body.reason,
    )  # fmt: skip
    return PurgedSession(
        seq=seq,
        session=session_id,
        receipt=receipt.receipt,
        digest=receipt.digest,
        key=receipt.key,
        purged=receipt.purged,
    )
