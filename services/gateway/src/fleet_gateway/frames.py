"""What a client may send on `/api/v1/ws/execution`, and the frames the gateway answers with.

Client frames are decoded strictly (`forbid_unknown_fields`): a frame naming a tenant, a user
or a workspace is refused with an error frame, never read, so identity comes only from the
ticket. A bad frame is answered with `{"type":"error","code":…,"message":…}` and the socket
stays open for the next one.
"""

from typing import Any

import msgspec

from fleet_events.git import ref_refusal, repo_url_refusal
from fleet_events.ids import InvalidId, check_id
from fleet_events.session import EXECUTION_MODES
from fleet_gateway.live import TRACE_MODES

MAX_FRAME_BYTES = 1024 * 1024
MAX_CONTENT_CHARS = 200_000
MAX_PATHS = 100
MAX_PATH_CHARS = 512


class MessageFrame(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                   tag="message", tag_field="type"):  # fmt: skip
    content: str
    session_id: str
    id: str | None = None
    """The frame's id, client-made and optional: the turn request's idempotency key (1-255
    printable characters), scoped to the tenant and the session; resending the frame with the
    same id answers the first answer and stores nothing more (the turn id is the gateway's)."""
    turn_id: str | None = None
    """The older spelling of `id`, taken when `id` is absent."""
    execution_mode: str = "auto"
    repo_url: str | None = None
    repo_ref: str | None = None
    context_paths: list[str] = []
    document_ids: list[str] = []
    trace: bool = True
    trace_mode: str = "compact"


class CancelFrame(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                  tag="cancel", tag_field="type"):  # fmt: skip
    session_id: str | None = None
    turn_id: str | None = None


class CommandFrame(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                   tag="command", tag_field="type"):  # fmt: skip
    command: str
    args: dict[str, Any] = {}
    session_id: str | None = None


ClientFrame = MessageFrame | CancelFrame | CommandFrame
_decoder = msgspec.json.Decoder(ClientFrame)

COMMANDS = ("resolve_hitl", "answer")
"""`resolve_hitl {message_id, action_label}` is the earlier system's answer to a clarification
request; `answer {request_id, answer, option?}` is ours. Both become `InputProvided`."""


class FrameError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_frame(code: str, message: str, **details: Any) -> str:
    body = {"type": "error", "code": code, "message": message, "details": details}
    return msgspec.json.encode(body).decode()


def _id(kind: str, value: str) -> str:
    try:
        return check_id(kind, value)
    except InvalidId as exc:
        raise FrameError(f"invalid_{kind}", f"{exc}; use letters, digits, '_' or '-'") from exc


def parse(text: str | bytes) -> ClientFrame:
    """A checked client frame, or `FrameError` saying what, which value, and what to do."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_FRAME_BYTES:
        raise FrameError(
            "frame_too_large",
            f"the frame is {size} bytes, over the limit of {MAX_FRAME_BYTES}: upload large "
            "context as a document (POST /api/v1/sessions/{id}/documents) and send its id",
        )
    try:
        frame = _decoder.decode(text)
    except msgspec.ValidationError as exc:
        raise FrameError(
            "invalid_frame",
            f'the frame was refused: {exc}; send {{"type": "message"|"cancel"|'
            '"command", ...}} with only the documented fields (identity comes from the ticket)',
        ) from exc
    except msgspec.DecodeError as exc:
        raise FrameError("malformed_frame", f"the frame is not JSON: {exc}") from exc
    match frame:
        case MessageFrame():
            _check_message(frame)
        case CancelFrame(session_id=session, turn_id=turn):
            if session is not None:
                _id("session", session)
            if turn is not None:
                _id("turn", turn)
        case CommandFrame(command=command, session_id=session):
            if command not in COMMANDS:
                raise FrameError(
                    "unknown_command",
                    f"command {command[:64]!r} is not known: use one of {', '.join(COMMANDS)}",
                )
            if session is not None:
                _id("session", session)
    return frame


def _check_message(frame: MessageFrame) -> None:
    _id("session", frame.session_id)
    if frame.turn_id is not None:
        _id("turn", frame.turn_id)
    if not frame.content.strip():
        raise FrameError("empty_message", "the message's content is empty: write a question")
    if len(frame.content) > MAX_CONTENT_CHARS:
        raise FrameError(
            "message_too_long",
            f"the message is {len(frame.content)} characters, over {MAX_CONTENT_CHARS}: upload "
            "it as a document and ask about it",
        )
    if frame.execution_mode not in EXECUTION_MODES:
        raise FrameError(
            "invalid_execution_mode",
            f"execution_mode {frame.execution_mode[:32]!r} is not one of "
            f"{', '.join(EXECUTION_MODES)}",
        )
    if frame.trace_mode not in TRACE_MODES:
        raise FrameError(
            "invalid_trace_mode",
            f"trace_mode {frame.trace_mode[:32]!r} is not one of {', '.join(TRACE_MODES)}",
        )
    check_repo(frame.repo_url, frame.repo_ref)
    check_context(frame.document_ids, frame.context_paths)


def check_context(document_ids: list[str], context_paths: list[str]) -> None:
    """A turn's named documents and sandbox paths (the frame's and `POST /{id}/turns`'s):
    FrameError (`too_many_paths`, `invalid_id`, `invalid_context_path`) naming the value."""
    if len(context_paths) > MAX_PATHS or len(document_ids) > MAX_PATHS:
        raise FrameError(
            "too_many_paths", f"at most {MAX_PATHS} context paths and {MAX_PATHS} document ids"
        )
    for doc in document_ids:
        _id("document", doc)
    for path in context_paths:
        parts = path.split("/")
        if (
            not path
            or len(path) > MAX_PATH_CHARS
            or path.startswith("/")
            or ".." in parts
            or "\x00" in path
        ):
            raise FrameError(
                "invalid_context_path",
                f"context path {path[:80]!r} is not usable: a path relative to the session "
                f"sandbox's working directory, without '..', at most {MAX_PATH_CHARS} characters",
            )


def check_repo(url: str | None, ref: str | None) -> None:
    """A turn's repository fields: FrameError (`repo_ref_requires_repo`, `invalid_repo_url`,
    `invalid_repo_ref`) naming the value and the rule it breaks, by the broker's own rules
    (`fleet_events.git`); local paths and file:// are never taken from a client."""
    if ref is not None and url is None:
        raise FrameError(
            "repo_ref_requires_repo",
            f"repo_ref {ref[:64]!r} names a ref of no repository: send repo_url too",
        )
    if url is not None:
        why = repo_url_refusal(url, allow_local=False)
        if why is not None:
            raise FrameError("invalid_repo_url", why)
    if ref is not None:
        why = ref_refusal(ref)
        if why is not None:
            raise FrameError("invalid_repo_ref", why.replace("ref ", "repo_ref ", 1))
