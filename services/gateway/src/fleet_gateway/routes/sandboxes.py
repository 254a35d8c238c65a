"""The tenant's sandboxes, asked of the broker over the bus (the gateway keeps none of its own).

- `GET /api/v1/sandboxes` (`session`, `cursor`, `limit`): one page of the broker's view of the
  caller's tenant, from the broker's queue group, so any replica answers for all of them.
- `GET /api/v1/sandboxes/{id}`: the replica holding that sandbox answers; no holder, or one that
  holds it for another tenant, is the same 404 (a 403 would confirm a foreign id exists).
- `DELETE /api/v1/sandboxes/{id}`: the holder stops it and removes its files.
- `POST /api/v1/sandboxes/{id}/archive`: the holder has its provider archive it (files kept,
  nothing running) and stops serving it; a provider that cannot (local) is 409
  `archive_refused`, recorded by the broker as `sandbox.archive_refused`.

What a client sees leaves out the host's details the broker knows (the workspace's host path,
the process id and uid): they say how the host is laid out and help no caller.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from fleet_events import bus, new_id
from fleet_events import sandbox as sb
from fleet_events.ids import InvalidId, check_id
from fleet_gateway.auth import CurrentPrincipal, CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_gateway.routes.common import BROKER, ask
from fleet_mesh import rpc

router = APIRouter(prefix="/api/v1/sandboxes", tags=["sandboxes"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 409, 422, 429, 502, 503, 504)
}
CALL_TIMEOUT_S = 10.0
DELETE_TIMEOUT_S = 30.0
MAX_PAGE = 500


class Capabilities(BaseModel):
    fork: bool
    fork_keeps_repl_memory: bool
    durable_volumes: bool
    network_isolation: bool
    archive: bool


class Sandbox(BaseModel):
    sandbox: str
    provider: str
    replica: str
    status: str
    parent: str | None = None
    labels: dict[str, str] = {}
    contexts: list[str] = []
    stopped_reason: str | None = None
    capabilities: Capabilities | None = None
    volume: str | None = None
    volume_subpath: str | None = None
    repo_url: str | None = None
    ref: str | None = None
    context_paths: list[str] = []


class SandboxPage(BaseModel):
    items: list[Sandbox]
    next_cursor: str | None = None


class Deleted(BaseModel):
    sandbox: str
    deleted: bool = True


def _shown(info: sb.SandboxInfo) -> Sandbox:
    caps = info.capabilities
    return Sandbox(
        sandbox=info.sandbox, provider=info.provider, replica=info.replica, status=info.status,
        parent=info.parent, labels=info.labels, contexts=info.contexts,
        stopped_reason=info.stopped_reason,
        capabilities=None if caps is None else Capabilities(
            fork=caps.fork, fork_keeps_repl_memory=caps.fork_keeps_repl_memory,
            durable_volumes=caps.durable_volumes, network_isolation=caps.network_isolation,
            archive=caps.archive,
        ),
        volume=info.volume, volume_subpath=info.volume_subpath, repo_url=info.repo_url,
        ref=info.ref, context_paths=info.context_paths,
    )  # fmt: skip


def _sandbox_not_found(sandbox: str) -> ApiError:
    return ApiError(
        404, "sandbox_not_found",
        f"no live sandbox {sandbox!r} in your tenant: check the id (list them with "
        "GET /api/v1/sandboxes)",
        details={"sandbox": sandbox},
    )  # fmt: skip


def _checked(sandbox: str) -> str:
    """The id becomes a NATS subject token: refused here, before any request, with the
    catalog's own rule (the bus would refuse it too, but as a server error)."""
    try:
        return check_id("sandbox", sandbox)
    except InvalidId as exc:
        raise ApiError(
            422, "invalid_sandbox_id", f"{exc} (as GET /api/v1/sandboxes lists them)",
            details={"sandbox": sandbox[:80]},
        ) from None  # fmt: skip


async def _ask(request: Request, verb: Any, req: Any, timeout: float, target: str | None) -> Any:
    """One broker call with what is this route's own: a call to one sandbox's holder that no
    replica takes, or one the holder does not find for this tenant, is that sandbox's 404;
    a request the broker declined (and recorded) is 409."""
    if target is None:
        return await ask(request, BROKER, verb, req, timeout=timeout)
    sandbox = target

    def not_found(_: rpc.RemoteError | None = None) -> ApiError:
        return _sandbox_not_found(sandbox)

    def declined(exc: rpc.RemoteError) -> ApiError:
        return ApiError(409, "archive_refused", exc.message[:400], details={"sandbox": sandbox})

    return await ask(
        request, BROKER, verb, req, timeout=timeout, target=sandbox,
        refusals={"not_found": not_found, "declined": declined}, no_responders=not_found,
    )  # fmt: skip


@router.get("", response_model=SandboxPage, responses=ERRORS)
async def list_sandboxes(
    tenant: CurrentTenant,
    request: Request,
    session: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> SandboxPage:
    req = sb.ListSandboxes(
        request_id=new_id(), tenant=tenant, session=session, cursor=cursor, limit=limit
    )
    page: sb.SandboxList = await _ask(request, bus.LIST_SANDBOXES, req, CALL_TIMEOUT_S, None)
    # the broker already scopes by tenant; filtering again costs nothing and holds if it ever errs
    items = [_shown(info) for info in page.items if info.tenant == tenant]
    return SandboxPage(items=items, next_cursor=page.next_cursor)


@router.get("/{sandbox_id}", response_model=Sandbox, responses=ERRORS)
async def get_sandbox(sandbox_id: str, tenant: CurrentTenant, request: Request) -> Sandbox:
    sandbox = _checked(sandbox_id)
    req = sb.GetSandbox(request_id=new_id(), tenant=tenant, sandbox=sandbox)
    info: sb.SandboxInfo = await _ask(request, bus.GET_SANDBOX, req, CALL_TIMEOUT_S, sandbox)
    if info.tenant != tenant:
        raise _sandbox_not_found(sandbox)
    return _shown(info)


@router.delete("/{sandbox_id}", response_model=Deleted, responses=ERRORS)
async def delete_sandbox(sandbox_id: str, principal: CurrentPrincipal, request: Request) -> Deleted:
    sandbox = _checked(sandbox_id)
    # the holder checks the tenant itself (a foreign sandbox is its not_found), so one call
    req = sb.DeleteSandbox(
        request_id=new_id(), tenant=principal.tenant, sandbox=sandbox,
        reason=f"deleted through the API by {principal.user[:64]}",
    )  # fmt: skip
    await _ask(request, bus.DELETE_SANDBOX, req, DELETE_TIMEOUT_S, sandbox)
    return Deleted(sandbox=sandbox)


@router.post("/{sandbox_id}/archive", response_model=Sandbox, responses=ERRORS)
async def archive_sandbox(
    sandbox_id: str, principal: CurrentPrincipal, request: Request
) -> Sandbox:
    sandbox = _checked(sandbox_id)
    req = sb.ArchiveSandbox(
        request_id=new_id(), tenant=principal.tenant, sandbox=sandbox,
        reason=f"archived through the API by {principal.user[:64]}",
    )  # fmt: skip
    info: sb.SandboxInfo = await _ask(request, bus.ARCHIVE_SANDBOX, req, DELETE_TIMEOUT_S, sandbox)
    if info.tenant != principal.tenant:  # the holder checks it; this holds if it ever errs
        raise _sandbox_not_found(sandbox)
    return _shown(info)
