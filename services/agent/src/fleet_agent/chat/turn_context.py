"""What a turn's request names beside its message (`TurnRequested.document_ids`,
`context_paths`: `fleet run --context`, the WebSocket `message` frame), made into text the
turn's modules see.

The named documents' text is read from the object store and put after the message, each under a
header naming it; the named sandbox paths are listed for the agent to read with code (they are
files of the checkout the session's sandbox was given). The message and the block together are
the turn's question: ChainOfThought and ReAct read them as the question, the RLM route as its
task, and the escalation rule counts their characters (a document past the context threshold
goes to the RLM, as a long message does).
"""

import logging

from fleet_agent.chat.documents import text_of
from fleet_events.session import DocumentRef, TurnRequested
from fleet_mesh.blobs import BlobNotFound, JetStreamBlobs

log = logging.getLogger("fleet.agent.chat")
MAX_LISTED_PATHS = 100


def block(
    documents: list[tuple[DocumentRef, str]], missing: list[str], paths: tuple[str, ...]
) -> str:
    """The text that follows the message (empty when the request names nothing). Pure."""
    parts = []
    for ref, text in documents:
        parts.append(
            f"[context document {ref.alias!r} ({ref.origin[:200]}, {len(text)} characters)]\n"
            f"{text}\n[end of document {ref.alias!r}]"
        )
    for alias in missing:
        parts.append(f"[context document {alias!r} was named but is not loaded in this session]")
    if paths:
        listed = ", ".join(paths[:MAX_LISTED_PATHS])
        more = f" and {len(paths) - MAX_LISTED_PATHS} more" if len(paths) > MAX_LISTED_PATHS else ""
        parts.append(
            "[context files, in the session sandbox's working directory (read them with code): "
            f"{listed}{more}]"
        )
    return "\n\n" + "\n\n".join(parts) if parts else ""


async def read_context(
    blobs: JetStreamBlobs, tenant: str, request: TurnRequested | None,
    documents: dict[str, DocumentRef],
) -> str:  # fmt: skip
    """The block for `request`, reading each named document's text (on the bus loop)."""
    if request is None or not (request.document_ids or request.context_paths):
        return ""
    found: list[tuple[DocumentRef, str]] = []
    missing: list[str] = []
    for alias in request.document_ids:
        ref = documents.get(alias)
        if ref is None:
            missing.append(alias)
            continue
        try:
            data = await blobs.get(tenant, ref.blob.sha256)
        except BlobNotFound:
            log.warning("a named document's text is gone", extra={"alias": alias})
            missing.append(alias)
            continue
        found.append((ref, text_of(data, ref.media_type, ref.origin)[0]))
    return block(found, missing, request.context_paths)
