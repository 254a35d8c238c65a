"""`POST /api/v1/runtime/tests/daytona`: the sandbox broker's Daytona probe, passed on.

The broker holds the Daytona client (and its key), so the probe runs there (`sandbox-broker.
test_daytona`): the settings, the circuit, then one live call, with the earlier system's fields
(`ok`, `preflight_ok`, `checks`, `guidance`, `latency_ms`, `error`; `output_preview` is always
empty, kept so both probes share one shape), cached by the broker for 10 s (`checked_at` says
when it was taken). A broker without Daytona answers `configured: false` with what to set. The
answer names no key.
"""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, Field

from fleet_events import bus
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_gateway.auth import CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_mesh import rpc

router = APIRouter(prefix="/api/v1", tags=["runtime"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 422, 502, 503, 504)
}
SLACK_S = 5.0  # over the probe's own timeout: the broker's preflight and reply


class DaytonaProbeRequest(BaseModel):
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


@router.post("/runtime/tests/daytona", response_model=DaytonaProbeResult, responses=ERRORS)
async def probe_daytona(
    tenant: CurrentTenant,
    request: Request,
    probe: Annotated[DaytonaProbeRequest | None, Body()] = None,
) -> DaytonaProbeResult:
    ask = probe or DaytonaProbeRequest()
    nc = request.app.state.gateway.nc
    if nc is None or not nc.is_connected:
        raise ApiError(503, "nats_unavailable", "the gateway has no bus connection; retry shortly")
    req = sb.TestDaytona(request_id=new_id(), tenant=tenant, timeout_s=ask.timeout_s)
    timeout = ask.timeout_s + SLACK_S
    try:
        got: sb.DaytonaProbe = await rpc.call_verb(nc, bus.TEST_DAYTONA, req, timeout=timeout)
    except NoRespondersError:
        raise ApiError(
            503, "broker_unavailable", "no sandbox broker is running to answer: start one"
        ) from None
    except rpc.RemoteError as exc:
        raise ApiError(
            502, f"broker_{exc.code}", f"the sandbox broker refused: {exc.message[:300]}"
        ) from None
    except (TimeoutError, NatsTimeout):
        raise ApiError(
            504, "broker_timeout", f"the sandbox broker did not answer within {timeout:g}s"
        ) from None
    return DaytonaProbeResult(
        kind=got.kind, ok=got.ok, preflight_ok=got.preflight_ok, configured=got.configured,
        checked_at=got.checked_at,
        checks=[DaytonaCheck(name=c.name, ok=c.ok, detail=c.detail) for c in got.checks],
        guidance=list(got.guidance), latency_ms=got.latency_ms, error=got.error,
        replica=got.replica,
    )  # fmt: skip
