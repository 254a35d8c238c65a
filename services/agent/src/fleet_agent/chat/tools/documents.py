"""The document tools: load (a URL, an upload, a sandbox path), list, activate, read, search
and chunk the session's documents; each load is the fact `document.loaded` on the log."""

from typing import Any

from fleet_agent.chat import documents as docs
from fleet_agent.chat.tools.kit import ToolError, ToolKit, TurnState, read_sandbox_file
from fleet_agent.chat.urls import UrlRefused
from fleet_events.session import DocumentActivated, DocumentLoaded, DocumentRef


class Documents:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def _store(self, alias: str, source: str, origin: str, data: bytes, media: str) -> str:
        text, media = docs.text_of(data, media, origin)
        blob = self.kit.ctx.mesh.bus.put_blob(text.encode())
        ref = docs.reference(alias, source, origin, blob, text, media)
        ref = self.kit.log(DocumentLoaded(document=ref)).event.document
        state = self.kit.state
        state.documents.pop(alias, None)
        state.documents[alias] = ref
        state.active = alias
        state.texts[alias] = text
        return f"loaded {alias!r} ({len(text)} characters, {media}); it is the active document"

    def load_document(self, source: str, alias: str = "") -> str:
        """Load a document into the session: an http(s) URL (public addresses only), an
        upload (upload:<sha256> as the upload answered), or a path in the session's sandbox.
        It becomes the active document."""
        try:
            if source.startswith(("http://", "https://")):
                return self.fetch_web_document(source, alias)
            if source.startswith("upload:"):
                digest = source.removeprefix("upload:")
                data = self._blob(digest)
                return self._store(docs.alias_for(digest[:12], alias), "upload", source, data, "")
            data = read_sandbox_file(self.kit, source)
            return self._store(docs.alias_for(source, alias), "sandbox_path", source, data, "")
        except docs.DocumentError as exc:
            raise ToolError(str(exc)) from None

    def fetch_web_document(self, url: str, alias: str = "") -> str:
        """Fetch a public web page or file (at most 10 MiB, 5 redirects) as a document."""
        try:
            fetched = self.kit.urls.fetch(url)
            return self._store(
                docs.alias_for(fetched.final_url, alias), "url", fetched.final_url,
                fetched.body, fetched.media_type,
            )  # fmt: skip
        except (UrlRefused, docs.DocumentError) as exc:
            raise ToolError(str(exc)) from None

    def _blob(self, digest: str) -> bytes:
        from fleet_mesh.blobs import BlobNotFound, InvalidDigest, JetStreamBlobs

        bus = self.kit.ctx.mesh.bus

        async def get() -> bytes:
            blobs = await JetStreamBlobs.open(bus.nc.jetstream())
            return await blobs.get(bus.tenant, digest)

        try:
            return bus.run(get(), timeout=60)
        except (BlobNotFound, InvalidDigest):
            raise ToolError(
                f"no upload {digest[:64]!r} in this workspace: give the digest the upload answered"
            ) from None

    def list_documents(self) -> str:
        """The session's documents, least recently used first; the active one is marked."""
        return listing(self.kit.state)

    def set_active_document(self, alias: str) -> str:
        """Make a loaded document the one later questions are about by default."""
        self._ref(alias)
        self.kit.log(DocumentActivated(alias=alias))
        state = self.kit.state
        state.documents[alias] = state.documents.pop(alias)
        state.active = alias
        return f"{alias!r} is the active document"

    def _ref(self, alias: str) -> DocumentRef:
        alias = alias or (self.kit.state.active or "")
        ref = self.kit.state.documents.get(alias)
        if ref is None:
            known = ", ".join(self.kit.state.documents) or "none yet; load_document first"
            raise ToolError(f"no document {alias!r} is loaded (loaded: {known})")
        return ref

    def text(self, alias: str = "") -> str:
        ref = self._ref(alias)
        cached = self.kit.state.texts.get(ref.alias)
        if cached is None:
            cached = self._blob(ref.blob.sha256).decode("utf-8", errors="replace")
            self.kit.state.texts[ref.alias] = cached
        return cached

    def read_file_slice(self, start_line: int = 1, num_lines: int = 100, alias: str = "") -> str:
        """Numbered lines of a loaded document (the active one by default), at most 200."""
        try:
            return docs.read_slice(self.text(alias), start_line, num_lines)
        except docs.DocumentError as exc:
            raise ToolError(str(exc)) from None

    def find_in_document(self, pattern: str, alias: str = "", regex: bool = False) -> str:
        """Lines of a loaded document that contain `pattern` (case-insensitive), numbered."""
        try:
            return docs.find(self.text(alias), pattern, regex=regex)
        except docs.DocumentError as exc:
            raise ToolError(str(exc)) from None

    def chunk_host(self, alias: str = "", size: int = docs.CHUNK_CHARS) -> list[dict[str, Any]]:
        """Cut a loaded document into chunks of about `size` characters at paragraph breaks:
        index, character range and a preview of each (read one with read_file_slice)."""
        return [vars(c) for c in docs.chunks(self.text(alias), size)]


def listing(state: TurnState) -> str:
    if not state.documents:
        return "no documents are loaded"
    return "\n".join(
        f"{'* ' if a == state.active else '  '}{a} ({d.source}: {d.origin[:120]}, {d.chars} chars)"
        for a, d in state.documents.items()
    )


__all__ = ["Documents", "listing"]
