"""Uploads into a session: documents, and a local checkout.

- `POST /api/v1/sessions/{id}/documents` (multipart `file`, optional `alias`, `title`): the
  text goes to the object store under the caller's tenant, and `DocumentLoaded` to the log (the
  agent's fold makes it the active document). Over `MAX_DOCUMENT_BYTES` is 413; text only
  (UTF-8), since the agent reads the blob as the document's text.
- `POST /api/v1/sessions/{id}/checkout` (multipart `bundle`: a tar, optionally gzipped): a
  directory the client uploaded ("local checkout" never means a path on a server's disk).
  Bounded in bytes, files and path shape; each regular file goes to the object store and the
  broker starts the session's sandbox with them as `context_files` and `local_checkout=True`
  (so children get the bounded text snapshot the isolation policy gives a checkout with no
  repo URL); `SandboxAttached` on the log makes it the session's sandbox.

Both charge the tenant's upload allowance (`quotas.UploadQuota`, shared by every replica) with
the bytes they would store, once everything else is checked and before anything is stored, and
give the bytes back when the upload then fails (the object store, the broker or the log write:
503/504, `UploadQuota.held`). An object store that does not keep a blob is 503
`blob_store_unavailable`.
"""

import io
import posixpath
import re
import tarfile
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from pydantic import BaseModel

from fleet_events import bus, new_id
from fleet_events.envelope import BlobRef
from fleet_events.sandbox import CreateSandbox
from fleet_events.session import (
    DocumentLoaded,
    DocumentRef,
    InterpreterState,
    SandboxAttached,
    log_subject,
)
from fleet_gateway.auth import CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody, not_found
from fleet_gateway.quotas import UploadQuota
from fleet_gateway.sessionlog import SessionLog, checked_session, session_log
from fleet_mesh import rpc

router = APIRouter(prefix="/api/v1/sessions", tags=["documents"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 413, 415, 422, 429, 503, 504)
}
MAX_DOCUMENT_BYTES = 10 * 1024 * 1024
MAX_CHECKOUT_BYTES = 50 * 1024 * 1024
"""Unpacked bytes of a checkout; the upload itself is bounded by the same number."""
MAX_CHECKOUT_FILES = 2000
CREATE_TIMEOUT_S = 60.0
ALIAS = re.compile(r"[A-Za-z0-9_.-]{1,64}")
BODY_LIMITS = {
    "/api/v1/sessions/*/documents": MAX_DOCUMENT_BYTES + 64 * 1024,
    "/api/v1/sessions/*/checkout": MAX_CHECKOUT_BYTES + 64 * 1024,
}
"""Route patterns (`*` one path segment) whose bodies may exceed the gateway's default limit."""


class Uploaded(BaseModel):
    alias: str
    sha256: str
    size: int
    chars: int
    seq: int


class CheckedOut(BaseModel):
    sandbox: str
    files: int
    bytes: int
    seq: int


async def _read(upload: UploadFile, limit: int, what: str) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise ApiError(
            413, f"{what}_too_large",
            f"the {what} is over the limit of {limit} bytes: split it, or put it in a repository",
            details={"limit": limit},
        )  # fmt: skip
    return data


def _allowance(request: Request) -> UploadQuota:
    """The tenant's upload allowance (shared by every replica): `held(...)` is 429 with
    `Retry-After` when it is short now, 413 when the size is over the whole of it; charged
    before anything is stored, after everything else was checked (a refused upload costs no
    allowance), and given back when the block fails."""
    uploads: UploadQuota | None = request.app.state.gateway.uploads
    if uploads is None:
        raise ApiError(
            503, "not_ready", "the gateway is waiting for the mesh's buckets; retry shortly",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    return uploads


async def _put(h: SessionLog, tenant: str, data: bytes) -> BlobRef:
    try:
        return await h.blobs.put(tenant, data)
    except (NatsError, TimeoutError) as exc:
        raise ApiError(
            503, "blob_store_unavailable",
            f"the object store did not keep the upload ({type(exc).__name__}); nothing was "
            "recorded and the upload allowance is given back: retry shortly",
            headers={"Retry-After": "2"},
        ) from exc  # fmt: skip


def _alias(alias: str | None, filename: str | None) -> str:
    name = alias or posixpath.splitext(posixpath.basename(filename or ""))[0] or "document"
    if not ALIAS.fullmatch(name):
        raise ApiError(
            422, "invalid_alias",
            f"alias {name[:80]!r} is not usable: 1-64 letters, digits, '_', '.' or '-' (pass "
            "alias= to choose one)",
        )  # fmt: skip
    return name


@router.post("/{session_id}/documents", response_model=Uploaded, status_code=201,
             responses=ERRORS)  # fmt: skip
async def upload_document(
    session_id: str,
    tenant: CurrentTenant,
    request: Request,
    file: Annotated[UploadFile, File(description="the document (UTF-8 text)")],
    alias: Annotated[str | None, Form()] = None,
    title: Annotated[str, Form(max_length=200)] = "",
) -> Uploaded:
    session = checked_session(session_id)
    name = _alias(alias, file.filename)
    data = await _read(file, MAX_DOCUMENT_BYTES, "document")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            415, "unsupported_media_type",
            f"{file.filename or 'the file'} is not UTF-8 text (byte {exc.start}): upload its "
            "text, or load it from a URL or a sandbox path through the agent",
        ) from exc  # fmt: skip
    h = await session_log(request)
    if (await h.store.head(log_subject(tenant, session))).seq == 0:
        raise not_found("session", session)  # before the blob: a refusal stores nothing
    async with _allowance(request).held(tenant, len(data), "document"):
        ref = await _put(h, tenant, data)
        doc = DocumentRef(
            alias=name, source="upload", origin=file.filename or name, blob=ref,
            chars=len(text), media_type=file.content_type or "text/plain", title=title,
        )  # fmt: skip
        _, seq = await h.write(tenant, session, DocumentLoaded(document=doc), create=False)
    return Uploaded(alias=name, sha256=ref.sha256, size=ref.size, chars=len(text), seq=seq)


def _members(data: bytes) -> dict[str, bytes]:
    """The regular files of a tar bundle, by safe relative path; anything else refused."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            files = _files_of(archive)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ApiError(
            422, "invalid_bundle",
            f"the bundle is not a tar archive ({exc}): send a tar or tar.gz of the directory "
            "(tar -czf checkout.tgz -C DIR .)",
        ) from exc  # fmt: skip
    if not files:
        raise ApiError(
            422, "invalid_bundle",
            "the bundle holds no regular file: put the directory's files in it (tar -czf "
            "checkout.tgz -C DIR .)",
        )  # fmt: skip
    return files


def _files_of(archive: tarfile.TarFile) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for member in archive:
        path = posixpath.normpath(member.name)
        if member.isdir():
            continue
        if not member.isfile():
            raise ApiError(
                422, "invalid_bundle",
                f"{member.name[:120]!r} is not a regular file (links and devices are refused)",
            )  # fmt: skip
        if path.startswith(("/", "..")) or path in (".", "") or "\x00" in path:
            raise ApiError(
                422, "invalid_bundle",
                f"path {member.name[:120]!r} leaves the checkout: use relative paths inside it",
            )  # fmt: skip
        total += member.size
        if total > MAX_CHECKOUT_BYTES or len(files) >= MAX_CHECKOUT_FILES:
            raise ApiError(
                413, "checkout_too_large",
                f"the checkout unpacks to more than {MAX_CHECKOUT_BYTES} bytes or "
                f"{MAX_CHECKOUT_FILES} files: leave out build outputs and data",
            )  # fmt: skip
        extracted = archive.extractfile(member)
        files[path] = extracted.read() if extracted is not None else b""
    return files


@router.post("/{session_id}/checkout", response_model=CheckedOut, status_code=201,
             responses=ERRORS)  # fmt: skip
async def upload_checkout(
    session_id: str,
    tenant: CurrentTenant,
    request: Request,
    bundle: Annotated[UploadFile, File(description="a tar (or .tar.gz) of the directory")],
) -> CheckedOut:
    session = checked_session(session_id)
    files = _members(await _read(bundle, MAX_CHECKOUT_BYTES, "checkout"))
    h = await session_log(request)
    if (await h.store.head(log_subject(tenant, session))).seq == 0:
        raise not_found("session", session)
    size = sum(len(data) for data in files.values())
    async with _allowance(request).held(tenant, size, "checkout"):
        refs: dict[str, BlobRef] = {
            path: await _put(h, tenant, data) for path, data in files.items()
        }
        create = CreateSandbox(
            request_id=new_id(), tenant=tenant, labels={"session": session},
            context_files=refs, local_checkout=True,
        )  # fmt: skip
        try:
            info = await rpc.call_verb(h.nc, bus.CREATE_SANDBOX, create, timeout=CREATE_TIMEOUT_S)
        except NoRespondersError:
            raise ApiError(
                503, "sandbox_unavailable",
                "no sandbox broker answers on the bus: start one (fleet up does), then upload "
                "again (the upload allowance is given back)",
                headers={"Retry-After": "5"},
            ) from None  # fmt: skip
        except TimeoutError:
            raise ApiError(
                504, "sandbox_timeout",
                f"the sandbox broker did not start the checkout's sandbox within "
                f"{CREATE_TIMEOUT_S:g} s; upload again (the files are kept, a retry stores none "
                "twice; the upload allowance is given back)",
            ) from None  # fmt: skip
        except rpc.RemoteError as exc:
            status = 422 if exc.code == "bad_request" else 503
            raise ApiError(
                status, "sandbox_unavailable" if status == 503 else "sandbox_refused",
                f"the sandbox broker could not start the checkout's sandbox: {exc.message}",
                details={"broker_code": exc.code},
            ) from None  # fmt: skip
        interpreter = InterpreterState(sandbox=info.sandbox)
        _, seq = await h.write(
            tenant, session, SandboxAttached(interpreter=interpreter, reason="local_checkout"),
            create=False,
        )  # fmt: skip
    return CheckedOut(
        sandbox=info.sandbox, files=len(refs), bytes=sum(r.size for r in refs.values()), seq=seq
    )
