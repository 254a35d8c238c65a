"""What the runtime is and whether it can work for the caller's tenant, asked of its owners.

- `GET /api/v1/info`: this gateway (service, version, API, replica) and who the token says the
  caller is, so a client learns its tenant and whether it may change global settings.
- `GET /api/v1/runtime/status`: the agent's view of the tenant's LLM roles (`agent.status`: the
  profile and model of each role and what is missing) beside the services that answer ping.
- `POST /api/v1/runtime/tests/lm`: the agent's model probe (`agent.test_lm`), with the earlier
  system's fields (`ok`, `preflight_ok`, `checks`, `guidance`, `latency_ms`, `output_preview`,
  `error`). The agent holds the secrets reader, so the probe runs there and its reply is already
  masked; the gateway passes on what it got.

The rest of the runtime surface is in its own modules, mounted under this router's `/api/v1`
(`router.include_router` at the end of this module): `settings` (runtime settings), `volumes`
(volume browse and preview), `traces` (runs, traces, OTLP export, feedback) and `optimization`
(503 until the quality service exists).
"""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, Field

from fleet_events import bus
from fleet_events import llm as lm
from fleet_gateway.auth import CurrentPrincipal, CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_gateway.readiness import check
from fleet_gateway.routes.common import AGENT, Strict, ask, nats, version

router = APIRouter(prefix="/api/v1", tags=["runtime"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 422, 502, 503, 504)
}
API_VERSION = "v1"
STATUS_TIMEOUT_S = 5.0
PROBE_SLACK_S = 5.0
"""Over the probe's own timeout: the agent's preflight and reply take a moment besides the LLM."""
Role = Literal["planner", "delegate", "delegate_small", "reflection"]


class Identity(BaseModel):
    tenant: str
    user: str
    admin: bool


class Info(BaseModel):
    service: str = "fleet-rlm"
    version: str
    api: str = API_VERSION
    replica: str
    caller: Identity


class RoleStatus(BaseModel):
    role: str
    profile: str | None
    model: str | None = None
    api_base: str | None = None
    has_api_key: bool = False
    api_key_found: bool = False
    problem: str = ""


class Component(BaseModel):
    name: str
    kind: str
    state: str
    detail: str = ""
    replica: str | None = None


class RuntimeStatus(BaseModel):
    ready: bool
    """The tenant's roles can run a turn and every part of the mesh answers (`/ready`'s)."""
    llm_ready: bool
    agent_replica: str | None
    roles: list[RoleStatus]
    guidance: list[str]
    components: list[Component]
    """What `/ready` checks: NATS, the streams and buckets, each service's ping."""


class LmProbe(Strict):
    role: Role = "planner"
    profile: str | None = Field(default=None, min_length=1, max_length=64)
    timeout_s: float = Field(default=20.0, gt=0, le=120)


class Check(BaseModel):
    name: str
    ok: bool
    detail: str = ""


class LmProbeResult(BaseModel):
    kind: str
    ok: bool
    preflight_ok: bool
    checked_at: datetime
    checks: list[Check]
    guidance: list[str]
    latency_ms: float | None
    output_preview: str
    error: str
    profile: str | None
    model: str | None


async def ask_agent(request: Request, verb: Any, req: Any, timeout: float) -> Any:
    return await ask(request, AGENT, verb, req, timeout=timeout)


@router.get("/info", response_model=Info, responses=ERRORS)
async def info(principal: CurrentPrincipal, request: Request) -> Info:
    caller = Identity(tenant=principal.tenant, user=principal.user, admin=principal.admin)
    return Info(version=version(), replica=request.app.state.gateway.replica, caller=caller)


@router.get("/runtime/status", response_model=RuntimeStatus, responses=ERRORS)
async def runtime_status(principal: CurrentPrincipal, request: Request) -> RuntimeStatus:
    """A component's detail and replica (the NATS address, a provider's last error) are the
    deployment's: shown to an admin only; any other caller gets each one's name and state."""
    tenant, admin = principal.tenant, principal.admin
    state = request.app.state.gateway
    readiness = await check(nats(request), state.settings.services, state.settings.probe_timeout_s)
    components = [
        Component(
            name=c.name, kind=c.kind, state=c.state, detail=c.detail if admin else "",
            replica=c.replica if admin else None,
        )
        for c in readiness.components
    ]  # fmt: skip
    try:
        agent: lm.AgentStatus = await ask_agent(
            request, bus.AGENT_STATUS, lm.GetAgentStatus(tenant=tenant), STATUS_TIMEOUT_S
        )
    except ApiError as exc:  # a status page reports a missing agent, it does not fail on it
        if exc.status == 503 and exc.code == "nats_unavailable":
            raise
        return RuntimeStatus(
            ready=False, llm_ready=False, agent_replica=None, roles=[],
            guidance=[exc.message], components=components,
        )  # fmt: skip
    # a global profile's address is the operator's (the embedded server, an internal proxy):
    # a tenant sees its own profiles' addresses, an admin every one
    roles = [
        RoleStatus(
            role=r.role, profile=r.profile, model=r.model,
            api_base=r.api_base if admin or not r.global_profile else None,
            has_api_key=r.has_secret, api_key_found=r.secret_found, problem=r.problem,
        )
        for r in agent.roles
    ]  # fmt: skip
    return RuntimeStatus(
        ready=agent.ready and readiness.ready, llm_ready=agent.ready,
        agent_replica=agent.replica, roles=roles, guidance=list(agent.guidance),
        components=components,
    )  # fmt: skip


@router.post("/runtime/tests/lm", response_model=LmProbeResult, responses=ERRORS)
async def probe_lm(
    tenant: CurrentTenant,
    request: Request,
    probe: Annotated[LmProbe | None, Body()] = None,
) -> LmProbeResult:
    ask = probe or LmProbe()
    req = lm.TestLm(tenant=tenant, role=ask.role, profile=ask.profile, timeout_s=ask.timeout_s)
    got: lm.TestLmResult = await ask_agent(request, bus.TEST_LM, req, ask.timeout_s + PROBE_SLACK_S)
    return probe_result(got)


def probe_result(got: lm.TestLmResult) -> LmProbeResult:
    return LmProbeResult(
        kind=got.kind, ok=got.ok, preflight_ok=got.preflight_ok, checked_at=got.checked_at,
        checks=[Check(name=c.name, ok=c.ok, detail=c.detail) for c in got.checks],
        guidance=list(got.guidance), latency_ms=got.latency_ms,
        output_preview=got.output_preview, error=got.error, profile=got.profile,
        model=got.model,
    )  # fmt: skip


def _mount() -> None:
    from fleet_gateway.routes import optimization, settings, traces, volumes

    for part in (settings.router, volumes.router, traces.router, optimization.router):
        router.include_router(part)


_mount()
