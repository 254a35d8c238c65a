"""`POST /api/v1/runtime/tests/daytona`: the sandbox broker's Daytona probe, passed on.

The broker holds the Daytona client (and its key), so the probe runs there (`sandbox-broker.
test_daytona`): the settings, the circuit, then one live call, with the earlier system's fields
(`ok`, `preflight_ok`, `checks`, `guidance`, `latency_ms`, `error`; `output_preview` is always
empty, kept so both probes share one shape), cached by the broker for 10 s (`checked_at` says
when it was taken). A broker without Daytona answers `configured: false` with what to set. The
answer names no key.

Only an admin sees the whole answer: the deployment's Daytona host, target and broker replica
are the operator's, and the error text of a failed call may name them. Any other caller gets
the verdict (`ok`, `preflight_ok`, `configured`, each check's name and pass/fail, `latency_ms`,
`checked_at`) with every check's detail, the replica and the error blanked, and guidance of the
gateway's own that names nothing of the deployment (`redacted: true`).
"""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, Field

from fleet_events import bus
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.errors import ErrorBody
from fleet_gateway.routes.common import BROKER, Strict, ask

router = APIRouter(prefix="/api/v1", tags=["runtime"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 422, 502, 503, 504)
}
SLACK_S = 5.0  # over the probe's own timeout: the broker's preflight and reply


class DaytonaProbeRequest(Strict):
    timeout_s: float = Field(default=20.0, gt=0, le=60)  # the earlier system's 20 s


class DaytonaCheck(BaseModel):
    name: str
    ok: bool
    detail: str = ""


class DaytonaProbeResult(BaseModel):
    kind: str
    ok: bool
    preflight_ok: bool
    configured: bool
    """False when the sandbox broker has no Daytona provider (guidance says what to set)."""
    checked_at: datetime
    checks: list[DaytonaCheck]
    guidance: list[str]
    latency_ms: float | None
    output_preview: str = ""
    error: str
    replica: str
    redacted: bool = False
    """True when the caller is not an admin: details, error and replica blanked (see above)."""


TENANT_GUIDANCE = {
    "not_configured": "Daytona is not configured on this deployment: ask an admin to set it up",
    "preflight": "this deployment's Daytona settings are incomplete: ask an admin (an admin's "
    "probe names what is missing)",
    "failing": "Daytona does not answer this deployment now: sandboxes on Daytona fail until it "
    "does; an admin's probe shows the error",
}


def _for_tenant(got: DaytonaProbeResult) -> DaytonaProbeResult:
    """The verdict without anything that names the deployment."""
    if got.ok:
        guidance, error = [], ""
    elif not got.configured:
        guidance, error = [TENANT_GUIDANCE["not_configured"]], "not configured"
    elif not got.preflight_ok:
        guidance, error = [TENANT_GUIDANCE["preflight"]], "preflight failed"
    else:
        guidance, error = [TENANT_GUIDANCE["failing"]], "the live call to Daytona failed"
    return got.model_copy(
        update={
            "checks": [DaytonaCheck(name=c.name, ok=c.ok) for c in got.checks],
            "guidance": guidance,
            "error": error,
            "replica": "",
            "redacted": True,
        }
    )


@router.post("/runtime/tests/daytona", response_model=DaytonaProbeResult, responses=ERRORS)
async def probe_daytona(
    principal: CurrentPrincipal,
    request: Request,
    probe: Annotated[DaytonaProbeRequest | None, Body()] = None,
) -> DaytonaProbeResult:
    wanted = probe or DaytonaProbeRequest()
    req = sb.TestDaytona(request_id=new_id(), tenant=principal.tenant, timeout_s=wanted.timeout_s)
    timeout = wanted.timeout_s + SLACK_S
    got: sb.DaytonaProbe = await ask(request, BROKER, bus.TEST_DAYTONA, req, timeout=timeout)
    result = DaytonaProbeResult(
        kind=got.kind, ok=got.ok, preflight_ok=got.preflight_ok, configured=got.configured,
        checked_at=got.checked_at,
        checks=[DaytonaCheck(name=c.name, ok=c.ok, detail=c.detail) for c in got.checks],
        guidance=list(got.guidance), latency_ms=got.latency_ms, error=got.error,
        replica=got.replica,
    )  # fmt: skip
    return result if principal.admin else _for_tenant(result)
