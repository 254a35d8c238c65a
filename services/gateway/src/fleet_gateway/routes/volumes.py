"""`GET /api/v1/runtime/volume/tree` and `/runtime/volume/file`: browse and preview the caller's
durable volumes, asked of the sandbox broker (`volume_list`, `volume_read`, queue group: any
replica answers, the volumes live under its volume root as `<tenant>/<volume>/...`).

The tenant is the token's, so a volume is only ever looked up under the caller's tenant
directory: another tenant's volume of the same name is not found. Paths are relative and
checked here (no `..`, no leading `/`, no backslash or NUL) before any request, and the broker
walks them by directory descriptor without following links. Listings and previews are capped.
"""

import base64
import hashlib
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from fleet_events import bus, new_id
from fleet_events import sandbox as sb
from fleet_events.ids import InvalidId, check_id
from fleet_gateway.auth import CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_gateway.routes.common import BROKER, ask, invalid_request
from fleet_mesh import rpc

router = APIRouter(prefix="/runtime/volume", tags=["runtime"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 422, 429, 502, 503, 504)
}
CALL_TIMEOUT_S = 10.0
MAX_ENTRIES = 1000
MAX_PREVIEW_BYTES = 256 * 1024
DEFAULT_PREVIEW_BYTES = 64 * 1024

VolumeName = Annotated[str, Query(min_length=1, max_length=64, description="a volume name")]
VolumePath = Annotated[str, Query(max_length=1024, description="relative to the volume's root")]


class Entry(BaseModel):
    name: str
    kind: Literal["file", "dir", "other"]
    size: int


class Tree(BaseModel):
    volume: str
    path: str
    entries: list[Entry]
    truncated: bool


class Preview(BaseModel):
    volume: str
    path: str
    bytes: int
    """How many bytes are shown (at most `max_bytes`)."""
    sha256: str
    """Of the bytes shown."""
    truncated: bool
    encoding: Literal["utf-8", "base64"]
    content: str


def _volume(name: str) -> str:
    try:
        return check_id("volume", name)
    except InvalidId as exc:
        raise ApiError(
            422, "invalid_volume", f"{exc}; a volume name is 1-64 of A-Z a-z 0-9 _ -",
            details={"volume": name[:80]},
        ) from None  # fmt: skip


def _path(path: str) -> str:
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or "\\" in path or "\x00" in path:
        raise ApiError(
            422, "invalid_volume_path",
            f"path {path[:200]!r} is refused: give a path relative to the volume's root, "
            "without '..', a leading '/', backslashes or NUL",
            details={"path": path[:200]},
        )  # fmt: skip
    return "/".join(p for p in parts if p not in ("", "."))


def _not_found(volume: str, path: str, why: str) -> ApiError:
    return ApiError(
        404, "volume_path_not_found",
        f"nothing at {path or '/'!r} in volume {volume!r} of your tenant ({why[:200]}): list "
        "the volume with GET /api/v1/runtime/volume/tree",
        details={"volume": volume, "path": path},
    )  # fmt: skip


async def _ask(request: Request, verb: Any, req: Any, volume: str, path: str) -> Any:
    """A path the broker refuses or cannot find is this volume's 404; a size it will not read
    is the caller's to change, like any malformed request."""

    def missing(exc: rpc.RemoteError) -> ApiError:
        return _not_found(volume, path, exc.message)

    def too_large(exc: rpc.RemoteError) -> ApiError:
        return invalid_request(BROKER, exc)

    refusals = {"path_refused": missing, "not_found": missing, "too_large": too_large}
    return await ask(request, BROKER, verb, req, timeout=CALL_TIMEOUT_S, refusals=refusals)


@router.get("/tree", response_model=Tree, responses=ERRORS)
async def volume_tree(
    tenant: CurrentTenant,
    request: Request,
    volume: VolumeName,
    path: VolumePath = "",
    max_entries: Annotated[int, Query(ge=1, le=MAX_ENTRIES)] = 200,
) -> Tree:
    name, where = _volume(volume), _path(path)
    req = sb.ListVolume(
        request_id=new_id(), tenant=tenant, volume=name, path=where, max_entries=max_entries
    )
    listing: sb.VolumeListing = await _ask(request, bus.LIST_VOLUME, req, name, where)
    entries = [Entry(name=e.name, kind=e.kind, size=e.size) for e in listing.entries]
    truncated = listing.truncated or len(entries) > max_entries
    return Tree(volume=name, path=where, entries=entries[:max_entries], truncated=truncated)


@router.get("/file", response_model=Preview, responses=ERRORS)
async def volume_file(
    tenant: CurrentTenant,
    request: Request,
    volume: VolumeName,
    path: Annotated[str, Query(min_length=1, max_length=1024)],
    max_bytes: Annotated[int, Query(ge=1, le=MAX_PREVIEW_BYTES)] = DEFAULT_PREVIEW_BYTES,
) -> Preview:
    name, where = _volume(volume), _path(path)
    if not where:
        raise ApiError(422, "invalid_volume_path", "path names no file: give a file's path")
    # one byte more than shown says whether there is more
    req = sb.ReadVolumeFile(
        request_id=new_id(), tenant=tenant, volume=name, path=where, max_bytes=max_bytes + 1,
        prefix=True,
    )  # fmt: skip
    got: sb.FileContent = await _ask(request, bus.READ_VOLUME_FILE, req, name, where)
    data = (got.data or b"")[:max_bytes]
    truncated = len(got.data or b"") > max_bytes
    shown, encoding, content = _content(data, truncated)
    return Preview(
        volume=name, path=where, bytes=len(shown), sha256=hashlib.sha256(shown).hexdigest(),
        truncated=truncated, encoding=encoding, content=content,
    )  # fmt: skip


def _content(data: bytes, truncated: bool) -> tuple[bytes, Literal["utf-8", "base64"], str]:
    """Text when the bytes are UTF-8 (a character the cap cut in half is left off the end),
    else base64."""
    for cut in range(4 if truncated else 1):
        part = data[: len(data) - cut]
        try:
            return part, "utf-8", part.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data, "base64", base64.b64encode(data).decode()
