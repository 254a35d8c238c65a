"""`GET /health` and `GET /ready`: the probes, unauthenticated because a probe has no token.

`/ready`'s full report names the deployment (the NATS server's version and address, each
service's replica, a provider's last error, the embedded model's state), which is the
operator's business, not the world's: the UI's host serves it beside the API. So anyone gets
the verdict and each component's state, and only a caller whose token is an admin's gets the
report as `readiness.check` made it. A token that is not an admin's, or that is refused, is no
reason to fail a probe: the verdict is answered all the same, and `withheld` says why the rest
is not there (and what would show it).
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel

from fleet_gateway.auth import bearer
from fleet_gateway.errors import ApiError
from fleet_gateway.readiness import Kind, Readiness, State, check

router = APIRouter(tags=["probes"])
SERVICE = "gateway"  # as app.SERVICE: the name it runs and answers ping under
ANONYMOUS = (
    "component details are shown to an admin only: send 'Authorization: Bearer <token>' with "
    "an admin token (fleet up prints one; `fleet doctor` sends it)"
)


class ComponentState(BaseModel):
    name: str
    kind: Kind
    state: State


class Verdict(BaseModel):
    """What `/ready` tells a caller who is not an admin: no address, replica, version or error
    text, since each one says how the deployment is laid out."""

    ready: bool
    components: list[ComponentState]
    degraded: list[str] = []
    withheld: str
    """Why the details are not shown, and how to see them."""


def verdict(report: Readiness, withheld: str) -> Verdict:
    components = [
        ComponentState(name=c.name, kind=c.kind, state=c.state) for c in report.components
    ]
    return Verdict(
        ready=report.ready, components=components, degraded=report.degraded, withheld=withheld
    )


async def withheld_from(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str:
    """Why this caller gets only the verdict; empty for an admin. The token is checked as on
    every /api route (and charged to its tenant's request rate), but a refusal is said here
    rather than raised: a probe's answer must not depend on a token."""
    if credentials is None:
        return ANONYMOUS
    authenticator = request.app.state.gateway.auth
    if authenticator is None:
        return "the gateway cannot check tokens yet (it is still starting); retry shortly"
    try:
        principal = await authenticator.authenticate(credentials.credentials)
        authenticator.rate.charge(principal.tenant)
    except ApiError as exc:  # its code only: a message may name the issuer's address
        if exc.status == 429:  # a good token, asking too often
            return f"too many requests for your tenant ({exc.code}); retry shortly; {ANONYMOUS}"
        return (
            f"your token was not accepted ({exc.code}; GET /api/v1/auth/me with it says why); "
            f"{ANONYMOUS}"
        )
    if not principal.admin:
        return f"user {principal.user[:64]!r} is not an admin; {ANONYMOUS}"
    return ""


@router.get("/health")
async def health(request: Request) -> dict[str, str]:
    """The process is alive and serving HTTP; says nothing about its dependencies."""
    return {"status": "ok", "service": SERVICE, "replica": request.app.state.gateway.replica}


@router.get("/ready", response_model=Readiness | Verdict)
async def ready(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> JSONResponse:
    """200 when every component is up (degraded counts as up), else 503; the body is the full
    report for an admin's token and the verdict for anyone else."""
    withheld = await withheld_from(request, credentials)
    state = request.app.state.gateway
    report = await check(state.nc, state.settings.services, state.settings.probe_timeout_s)
    body = verdict(report, withheld) if withheld else report
    return JSONResponse(body.model_dump(), status_code=200 if report.ready else 503)
