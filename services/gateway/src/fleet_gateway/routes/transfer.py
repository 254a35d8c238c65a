"""Export, import and restore of a session's log.

- `POST /api/v1/sessions/{id}/export`: the session's log as a bundle (`fleet_mesh.bundle`):
  first the deployment's key-set line (the public keys and their owners, `FLEET_KEYSET`; shown
  to an auditor, who pins their own copy), then the verbatim stored bytes with their hashes and
  signatures, then every payload they reference, so the file verifies and replays with no
  server (`fleet audit verify FILE --keys keyset.json`); its last line is the seal, signed with
  the gateway's key, naming every subject's head, the event count and every blob, so a
  truncated export or one missing a blob line is refused.
- `POST /api/v1/sessions/import`: a bundle into the caller's tenant (any tenant: the bundle is
  checked, not trusted). Every signature is checked against this gateway's pinned key set
  (`FLEET_KEYSET`; the bundle's own key-set line is never trusted): an event signed by a key the
  deployment does not hold, unsigned where the key set requires signatures, or whose signature
  does not verify is refused. A gateway given no key set checks the signatures against the
  key-set line the bundle carries (a consistency check only: the bundle's writer chose those
  keys). It becomes a new session whose log opens with `SessionImported` carrying the state
  the bundle folds to and the source `.log`'s head hash; its blobs are copied into the
  caller's tenant and the state's references point at the copies. A bundle that does not
  verify is refused naming its first bad event, and nothing is stored: the import applies
  `fleet_mesh.bundle.read_bundle`, the rule `fleet audit verify` applies.
- `POST /api/v1/sessions/{id}/restore`: the state as of `upto_seq` (default: the whole log) is
  recorded as `SessionRestored`; a session whose sandbox is gone gets one on the same volume
  (the broker's `resume` verb) and the log records `SandboxAttached` replacing it.

The state is folded by the gateway's own fold of the session vocabulary (the projections'),
never the agent's: services do not import each other.
"""

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Body, Request
from fastapi.responses import StreamingResponse
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, Field

from fleet_events import bus, new_id, subjects
from fleet_events.chain import HASH_HEADER
from fleet_events.codec import CodecError
from fleet_events.envelope import BlobRef, Offloaded
from fleet_events.sandbox import ResumeSandbox
from fleet_events.session import (
    SandboxAttached,
    SessionCreated,
    SessionImage,
    SessionImported,
    SessionRestored,
    log_subject,
    session_filter,
)
from fleet_events.signing import KeySet, SigningError
from fleet_gateway.auth import CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody, not_found
from fleet_gateway.projections.store import Folded, ProjectionStore
from fleet_gateway.routes.audit import pinned_keys
from fleet_gateway.routes.common import Strict
from fleet_gateway.sessionlog import SessionLog, checked_session, session_log
from fleet_mesh import rpc
from fleet_mesh.bundle import Bundle, Sealer, blob_line, payload_refs, read_bundle
from fleet_mesh.store import EMPTY, RawEvent
from fleet_mesh.store.records import export_line, exported_keys, keyset_line

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody}, 404: {"model": ErrorBody}, 413: {"model": ErrorBody},
    422: {"model": ErrorBody},
}  # fmt: skip
MAX_IMPORT_BYTES = 64 * 1024 * 1024
BODY_LIMITS = {"/api/v1/sessions/import": MAX_IMPORT_BYTES}
RESUME_TIMEOUT_S = 30.0


async def _raw_events(h: SessionLog, tenant: str, session: str) -> list[RawEvent]:
    return [raw async for raw in h.store.read_raw(session_filter(tenant, session))]


async def _export_lines(
    h: SessionLog, tenant: str, session: str, raws: list[RawEvent], keys: KeySet | None
) -> AsyncIterator[bytes]:
    if keys is not None:
        yield keyset_line(keys) + b"\n"
    sealer = Sealer(session_filter(tenant, session), h.store.signer)
    wanted: dict[str, str] = {}
    for raw in raws:
        yield export_line(raw) + b"\n"
        sealer.event(raw.subject, raw.seq, raw.headers.get(HASH_HEADER))
        for obj, sha, _ in payload_refs(raw.data):
            wanted.setdefault(sha, obj)
    done: set[str] = set()
    while wanted:
        sha, obj = wanted.popitem()
        if sha in done:
            continue
        done.add(sha)
        data = await h.blobs.get(tenant, sha)  # the caller's tenant: never another's object
        yield blob_line(obj, sha, data) + b"\n"
        sealer.blob(sha)
        for inner_obj, inner, _ in payload_refs(data):  # an offloaded envelope's own blobs
            if inner not in done:
                wanted.setdefault(inner, inner_obj)
    yield sealer.line() + b"\n"


@router.post(
    "/{session_id}/export",
    responses={**ERRORS, 200: {"content": {"application/x-ndjson": {}}}},
    response_class=StreamingResponse,
)
async def export(session_id: str, tenant: CurrentTenant, request: Request) -> StreamingResponse:
    """The session's log as JSON lines that verify on their own (`fleet audit verify FILE`)."""
    session = checked_session(session_id)
    keys = pinned_keys()
    h = await session_log(request)
    raws = await _raw_events(h, tenant, session)
    if not raws:
        raise not_found("session", session)
    return StreamingResponse(
        _export_lines(h, tenant, session, raws, keys),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{session}.jsonl"'},
    )


class Imported(BaseModel):
    session_id: str
    seq: int
    source_session: str
    source_head_hash: str
    events: int
    blobs: int


class RestoreRequest(Strict):
    upto_seq: int | None = Field(default=None, ge=1)
    reason: str = Field(default="", max_length=500)


class Restored(BaseModel):
    session_id: str
    seq: int
    upto_seq: int
    sandbox: str | None = None
    replaced: str | None = None
    sandbox_error: str | None = None
    """Set when the state was restored but the broker could give the session no sandbox (the
    agent asks again when the next turn needs one)."""


async def _folded(tenant: str, session: str, folded: list[Folded]) -> tuple[SessionImage, str]:
    """(the image, the title) the events fold to, through the projections' own fold, in a
    throwaway in-memory database (the replica's read models are not touched)."""
    models = ProjectionStore(None)
    try:
        await models.apply_batch(folded)
        row = models.session(tenant, session)
    finally:
        models.close()
    if row is None:
        return SessionImage(), ""
    image = row.get("image")
    raw = image if isinstance(image, bytes) else str(image).encode()
    return msgspec.json.decode(raw, type=SessionImage), str(row.get("title") or "")


def _refused(bundle: Bundle, pinned: bool) -> ApiError:
    fault = bundle.fault
    assert fault is not None
    advice = "export the session again"
    if pinned and "not in the pinned key set" in fault.reason:
        advice = (
            "an export of another deployment imports where its public keys are pinned: add "
            "them to this gateway's key set (FLEET_KEYSET) after checking them"
        )
    return ApiError(
        422,
        "export_invalid",
        f"the export does not verify: {fault.subject} seq {fault.seq} (event {fault.event_id}): "
        f"{fault.reason}; nothing was imported ({advice})",
        details={"subject": fault.subject, "seq": fault.seq, "event": fault.event_id,
                 "reason": fault.reason},
    )  # fmt: skip


def _rehome(image: SessionImage, refs: dict[str, BlobRef]) -> SessionImage:
    """The image as the importing tenant's: its documents in this tenant's object store, and
    no sandbox of the source's (an imported session gets a fresh one when it first needs
    one, made like the source's: same repository, ref, context paths and volume). The source's
    sandbox id and its host workspace path are not carried over: the sandbox is another
    session's (perhaps another tenant's), and the path is the source host's."""
    docs = tuple(
        msgspec.structs.replace(d, blob=refs.get(d.blob.sha256, d.blob)) for d in image.documents
    )
    interpreter = image.interpreter
    if interpreter is not None:
        interpreter = msgspec.structs.replace(interpreter, sandbox=None, workspace="")
    return msgspec.structs.replace(image, documents=docs, interpreter=interpreter)


@router.post("/import", response_model=Imported, status_code=201, responses=ERRORS)
async def import_session(
    request: Request,
    tenant: CurrentTenant,
) -> Imported:
    """Body: an export (`application/x-ndjson`). A new session of the caller's tenant."""
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_IMPORT_BYTES:
        raise _too_large(size)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_IMPORT_BYTES:
            raise _too_large(len(body))
    lines = bytes(body).splitlines()
    pinned = pinned_keys()
    # sealed always: an export cut short keeps every line it still has valid (fleet_events.seal)
    bundle = read_bundle(lines, keys=pinned or carried_keys(lines), require_seal=True)
    if not bundle.ok:
        raise _refused(bundle, pinned is not None)
    h = await session_log(request)
    source = subjects.parse_session(bundle.events[0].subject)
    assert source is not None  # read_bundle refuses a bundle of no one session
    source_tenant, source_session = source.tenant, source.session
    folded: list[Folded] = []
    for row in bundle.events:
        try:
            stored = h.codec.decode_stored(row.payload)
            if isinstance(stored.data, Offloaded):
                stored = h.codec.decode_stored(bundle.blobs[stored.data.blob.sha256])
        except CodecError as exc:
            raise ApiError(
                422, "export_unreadable",
                f"event {row.id} (seq {row.seq}) is not an event this gateway knows: {exc}",
            ) from exc  # fmt: skip
        folded.append(Folded(row.subject, row.seq, stored))
    image, title = await _folded(source_tenant, source_session, folded)
    refs = {sha: await h.blobs.put(tenant, data) for sha, data in bundle.blobs.items()}
    image = _rehome(image, refs)
    log_head = [r for r in bundle.events if r.subject.endswith(".log")]
    head_hash = log_head[-1].hash if log_head else ""
    session = new_id()
    subject = log_subject(tenant, session)
    opened = h.envelope(tenant, session, SessionCreated(title=title))
    imported = h.envelope(
        tenant, session,
        SessionImported(image=image, source_session=source_session, source_head_hash=head_hash),
    )  # fmt: skip
    done = await h.store.append_batch(subject, [opened, imported], expect=EMPTY)
    return Imported(
        session_id=session, seq=done[-1].seq, source_session=source_session,
        source_head_hash=head_hash, events=len(bundle.events), blobs=len(refs),
    )  # fmt: skip


def carried_keys(lines: list[bytes]) -> KeySet | None:
    """The key set the bundle's first line says it was signed with, signatures not required (a
    gateway with no pinned keys checks the bundle against itself); None when it has none."""
    try:
        carried = exported_keys(lines[:1])
    except RecursionError as exc:  # a reader's stack, not a 500: it is the sender's JSON
        raise ApiError(
            422, "export_invalid",
            "export line 1 nests JSON deeper than any export does: it is not an export fleet "
            "wrote; nothing was imported",
        ) from exc  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError, SigningError) as exc:
        raise ApiError(
            422, "export_invalid",
            f"the export's key-set line is not a key set ({exc}); nothing was imported",
        ) from exc  # fmt: skip
    if carried is None:
        return None
    return KeySet(keys=carried.keys, require_signatures=False)


def _too_large(size: int) -> ApiError:
    return ApiError(
        413, "export_too_large",
        f"the export is {size} bytes, over the import limit of {MAX_IMPORT_BYTES}",
    )  # fmt: skip


@router.post("/{session_id}/restore", response_model=Restored, responses=ERRORS)
async def restore(
    session_id: str,
    tenant: CurrentTenant,
    request: Request,
    body: Annotated[RestoreRequest | None, Body()] = None,
) -> Restored:
    """Replay the log (up to `upto_seq`) into the session's state and record it; a sandbox
    that is gone is replaced on the same volume."""
    session = checked_session(session_id)
    asked = body or RestoreRequest()
    h = await session_log(request)
    raws = await _raw_events(h, tenant, session)
    if not raws:
        raise not_found("session", session)
    upto = asked.upto_seq or raws[-1].seq
    folded = [
        Folded(raw.subject, raw.seq, await h.codec.decode(raw.data, tenant=tenant))
        for raw in raws
        if raw.seq <= upto
    ]
    image, _ = await _folded(tenant, session, folded)
    _, seq = await h.write(
        tenant, session, SessionRestored(image=image, upto_seq=upto, reason=asked.reason),
        create=False,
    )  # fmt: skip
    result = Restored(session_id=session, seq=seq, upto_seq=upto)
    interp = image.interpreter
    if interp is None or interp.sandbox is None:
        return result
    try:
        info = await rpc.call_verb(
            h.nc, bus.RESUME_SANDBOX,
            ResumeSandbox(request_id=new_id(), tenant=tenant, sandbox=interp.sandbox),
            timeout=RESUME_TIMEOUT_S,
        )  # fmt: skip
    except (rpc.RemoteError, NoRespondersError, NatsTimeout, TimeoutError) as exc:
        result.sandbox_error = f"sandbox_unavailable: {getattr(exc, 'message', '') or exc!r}"
        return result
    result.sandbox = info.sandbox
    if info.sandbox != interp.sandbox:
        attached = msgspec.structs.replace(interp, sandbox=info.sandbox, workspace="")
        _, result.seq = await h.write(
            tenant, session,
            SandboxAttached(interpreter=attached, replaces=interp.sandbox, reason="restored"),
            create=False,
        )  # fmt: skip
        result.replaced = interp.sandbox
    return result
