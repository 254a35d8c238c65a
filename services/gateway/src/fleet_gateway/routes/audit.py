"""The audit of one session: `GET /api/v1/sessions/{id}/audit`.

The store re-hashes every stored message of the session (all its subjects) and, when this
replica was given the public key set (`FLEET_KEYSET`, as `fleet up` gives every service),
checks each signature against it: the verdict names the first bad event. The UI's audit badge
shows this answer; a browser re-hashing what the gateway sent it would vouch for nothing.
Another tenant's session is the same 404 as one that does not exist.
"""

import functools
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from fleet_events.session import session_filter
from fleet_events.signing import KeySet, SigningError
from fleet_gateway.auth import CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody, not_found
from fleet_gateway.sessionlog import checked_session, session_log
from fleet_mesh.checkpoints import KEYSET_ENV
from fleet_mesh.keyfiles import read_keyset

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody}, 404: {"model": ErrorBody}, 422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}  # fmt: skip


class Fault(BaseModel):
    subject: str
    seq: int
    event_id: str
    reason: str


class Audit(BaseModel):
    session_id: str
    ok: bool
    checked: int
    """Events re-hashed before the verdict (up to and including the first bad one)."""
    signatures: bool
    """True when signatures were checked against the pinned key set; false: the chain only."""
    require_signatures: bool
    fault: Fault | None = None


@functools.cache
def _keys(path: str) -> KeySet:
    return read_keyset(Path(path))


def pinned_keys() -> KeySet | None:
    """The key set this replica was given, or None (then only the chain is checked)."""
    path = os.environ.get(KEYSET_ENV)
    if not path:
        return None
    try:
        return _keys(path)
    except (OSError, SigningError, KeyError, ValueError) as exc:
        raise ApiError(
            503, "audit_keys_unreadable",
            f"the gateway's key set {KEYSET_ENV}={path} cannot be read ({exc}); "
            "fix the file or unset the variable to check the chain only",
        ) from exc  # fmt: skip


@router.get("/{session_id}/audit", response_model=Audit, responses=ERRORS)
async def audit(session_id: str, tenant: CurrentTenant, request: Request) -> Audit:
    """Verify the session's stored log: every hash, and every signature when keys are pinned."""
    session = checked_session(session_id)
    h = await session_log(request)
    keys = pinned_keys()
    result = await h.store.verify(session_filter(tenant, session), keys=keys)
    if result.checked == 0 and result.fault is None:
        raise not_found("session", session)
    fault = result.fault
    return Audit(
        session_id=session, ok=result.ok, checked=result.checked, signatures=keys is not None,
        require_signatures=bool(keys and keys.require_signatures),
        fault=Fault(subject=fault.subject, seq=fault.seq, event_id=fault.event_id,
                    reason=fault.reason) if fault else None,
    )  # fmt: skip
