"""The chat agent's tools, by the earlier system's families and names (fleet-rlm-behaviour.md
section 2), each call recorded on the turn's run as `run.tool_called` / `run.tool_returned`.

Tools run in dspy's thread. What they change in the session is appended to the session's log
as the fact the fold reads (`memory.core_changed`, `document.loaded`, `input.requested`, ...),
and mirrored in `TurnState` so later tools of the same turn see it. A tool that cannot do what
was asked answers a sentence the model can act on ("error: ..."), and the record keeps it as
the call's `error`; it never raises into ReAct, whose own handler would show a host traceback.

Which tools a turn gets depends on its mode: `tools_only` drops the recursion and long-context
tools (they run the RLM); `rlm_only` never reaches ReAct.
"""

import concurrent.futures
import functools
import hashlib
import inspect
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy
from pydantic_core import to_jsonable_python

from fleet_agent.chat import documents as docs
from fleet_agent.chat.session_log import LogScope, append, wait_for_answer
from fleet_agent.chat.signatures import LONG_CONTEXT, RLM_TURN
from fleet_agent.chat.urls import UrlLoader, UrlRefused
from fleet_agent.engine.model import RlmResult, RlmTask, RunContext, child_run_id
from fleet_agent.engine.recorder import RunRecorder
from fleet_events import new_id
from fleet_events.run import (
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import (
    CoreMemory,
    CoreMemoryChanged,
    DocumentActivated,
    DocumentLoaded,
    DocumentRef,
    InputExpired,
    InputRequested,
    MemoryFile,
    MemoryFileWritten,
)
from fleet_events.session_fold import append_core_memory, replace_core_memory
from fleet_mesh.rpc import RemoteError

RESULT_CHARS = 16_000
BATCH_LIMIT = 4
MEMORY_DIR = "memory"
LISTING_LIMIT = 100
MEMORY_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_./-]{0,199}")


class ToolError(Exception):
    """What a tool answers the model when it cannot do what was asked."""


class ParkTurn(BaseException):
    """`ask_user` under parking: the question is stored, the turn unwinds out of dspy (a
    BaseException, so neither ReAct nor the recording wrapper turns it into an observation)
    and the worker records `TurnParked`."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id


Engine = Callable[[RlmTask, RunContext], RlmResult]
"""Runs one RLM run to its end (the engine's `run_rlm`, bridged to a blocking call)."""


@dataclass
class TurnState:
    """What the tools of this turn read and change, seeded from the session's fold."""

    memory: CoreMemory
    documents: dict[str, DocumentRef]
    active: str | None
    memory_files: dict[str, MemoryFile]
    history: list[dict[str, str]]
    texts: dict[str, str] = field(default_factory=dict)


@dataclass
class ToolKit:
    """Everything a tool reaches, built per turn by the runner."""

    ctx: RunContext
    recorder: RunRecorder
    state: TurnState
    engine: Engine
    sandbox: Callable[[], str]
    urls: UrlLoader
    rlm_task: RlmTask
    clarify_timeout_s: float
    mode: str
    park: bool = False
    """Park the turn on a question (give the worker back) instead of waiting in it."""
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def scope(self) -> LogScope:
        return LogScope(self.ctx.tenant, self.ctx.session, self.ctx.turn, self.ctx.run)

    def log(self, event: Any) -> int:
        """Append a session fact to the log; its stream sequence."""
        return self.ctx.mesh.bus.run(append(self.ctx.mesh, self.scope, event), timeout=30).seq

    def next_call_id(self) -> str:
        with self._lock:
            self.calls += 1
            return f"{self.ctx.run}-t{self.calls}"


FILE_REFUSALS = ("path_refused", "too_large")
"""The broker's answers about a path that the model can act on (its message says why)."""


def read_sandbox_file(kit: ToolKit, path: str) -> bytes:
    """A file of the session's sandbox workspace; the broker's refusal (no such file, a path
    outside the workspace, too large) told to the model as it said it."""
    try:
        return kit.ctx.mesh.bus.read_file(kit.sandbox(), path)
    except RemoteError as exc:
        if exc.code not in FILE_REFUSALS:
            raise
        hint = " (list_files shows what is there)" if exc.code == "path_refused" else ""
        raise ToolError(exc.message[:500] + hint) from None


def write_sandbox_file(kit: ToolKit, path: str, data: bytes) -> None:
    try:
        kit.ctx.mesh.bus.put_file(kit.sandbox(), path, data)
    except RemoteError as exc:
        if exc.code not in FILE_REFUSALS:
            raise
        raise ToolError(exc.message[:500]) from None


def _shown(value: Any) -> Any:
    try:
        return to_jsonable_python(value, fallback=str)
    except Exception:
        return f"<{type(value).__name__}>"


def recorded(kit: ToolKit, name: str, fn: Callable[..., Any]) -> dspy.Tool:
    """`fn` as a dspy tool whose every call and result (or error) is on the run's record."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        call_id = kit.next_call_id()
        kit.recorder.record(
            ToolCalled(call_id=call_id, tool=name, args=_shown(dict(bound.arguments)))
        )
        started = time.monotonic()
        error = ""
        try:
            result: Any = fn(*args, **kwargs)
        except ToolError as exc:
            error = str(exc)
            result = f"error: {error}"
        except Exception as exc:  # a tool's own bug: the model is told which tool, not the text
            error = f"{name} failed ({type(exc).__name__})"
            result = f"error: {error}; try another way"
        shown = _shown(result)
        if isinstance(shown, str) and len(shown) > RESULT_CHARS:
            shown = shown[:RESULT_CHARS] + f"\n[cut at {RESULT_CHARS} characters]"
        kit.recorder.record(
            ToolReturned(
                call_id=call_id, tool=name, result=shown, error=error,
                duration_ms=round((time.monotonic() - started) * 1000, 3),
            )
        )  # fmt: skip
        return shown

    return dspy.Tool(call, name=name)


# -- documents ---------------------------------------------------------------------------------


class Documents:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def _store(self, alias: str, source: str, origin: str, data: bytes, media: str) -> str:
        text, media = docs.text_of(data, media, origin)
        blob = self.kit.ctx.mesh.bus.put_blob(text.encode())
        ref = docs.reference(alias, source, origin, blob, text, media)
        self.kit.log(DocumentLoaded(document=ref))
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


# -- memory ------------------------------------------------------------------------------------


class Memory:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def _decided(self, event: Any) -> str:
        self.kit.log(event)
        if isinstance(event, CoreMemoryChanged):
            memory = self.kit.state.memory
            values = {b: getattr(memory, b) for b in ("persona", "human", "scratchpad")}
            values[event.block] = event.value
            self.kit.state.memory = CoreMemory(**values)
            return f"core memory {event.block!r} now holds {len(event.value)} characters"
        raise ToolError(event.message)

    def core_memory_append(self, block: str, text: str) -> str:
        """Append a line to a core-memory block: persona (2,000 characters), human (2,000)
        or scratchpad (1,000)."""
        return self._decided(append_core_memory(self.kit.state.memory, block, text))

    def core_memory_replace(self, block: str, old: str, new: str) -> str:
        """Replace the one occurrence of `old` in a core-memory block with `new` (empty
        `new` deletes it); quote `old` exactly."""
        return self._decided(replace_core_memory(self.kit.state.memory, block, old, new))

    def _path(self, path: str) -> str:
        if MEMORY_PATH.fullmatch(path) is None or ".." in path.split("/"):
            raise ToolError(
                f"memory path {path[:80]!r} is not usable: use a relative path of letters, "
                "digits, '_', '-', '.' and '/', without '..'"
            )
        return f"{MEMORY_DIR}/{path}"

    def memory_write(self, path: str, content: str) -> str:
        """Write a memory file on the session's volume (kept across turns and restores)."""
        data = content.encode()
        write_sandbox_file(self.kit, self._path(path), data)
        file = MemoryFile(path=path, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        self.kit.log(MemoryFileWritten(file=file))
        self.kit.state.memory_files[path] = file
        return f"wrote memory file {path!r} ({len(data)} bytes)"

    def memory_read(self, path: str) -> str:
        """Read a memory file the agent wrote earlier."""
        if path not in self.kit.state.memory_files:
            known = ", ".join(self.kit.state.memory_files) or "none"
            raise ToolError(f"no memory file {path!r} (written so far: {known})")
        data = read_sandbox_file(self.kit, self._path(path))
        return data.decode("utf-8", errors="replace")

    def memory_list(self) -> list[str]:
        """The memory files of this session."""
        return sorted(self.kit.state.memory_files)


# -- sandbox code --------------------------------------------------------------------------


class Sandbox:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def execute_code(self, code: str) -> str:
        """Run Python in the session's sandbox (a fresh REPL context; files in its workspace
        persist) and answer what it printed."""
        return self._run(code)

    def list_files(self, path: str = ".") -> list[str]:
        """Files under `path` in the session's sandbox workspace (at most 100, as the earlier
        system listed), relative to the workspace."""
        code = (
            "import os\n"
            "found = []\n"
            "for root, dirs, files in os.walk(path):\n"
            "    dirs.sort()\n"
            "    for name in sorted(files):\n"
            "        found.append(os.path.relpath(os.path.join(root, name)))\n"
            "        if len(found) >= LIMIT:\n"
            "            break\n"
            "    if len(found) >= LIMIT:\n"
            "        break\n"
            "print('\\n'.join(found))"
        )
        listed = self._run(code, {"path": path, "LIMIT": LISTING_LIMIT})
        return [line for line in listed.splitlines() if line]

    def workspace_read(self, path: str) -> str:
        """Read a text file from the session's sandbox workspace."""
        data = read_sandbox_file(self.kit, path)
        return data.decode("utf-8", errors="replace")

    def workspace_write(self, path: str, content: str) -> str:
        """Write a text file in the session's sandbox workspace (it persists across turns)."""
        data = content.encode()
        write_sandbox_file(self.kit, path, data)
        return f"wrote {path!r} ({len(data)} bytes)"

    def _run(self, code: str, variables: dict[str, Any] | None = None) -> str:
        from dspy.primitives.code_interpreter import CodeInterpreterError

        from fleet_agent.interpreter import RemoteInterpreter

        interpreter = RemoteInterpreter(self.kit.ctx.mesh.bus, self.kit.sandbox())
        try:
            output = interpreter.execute(code, variables)
        except SyntaxError as exc:
            raise ToolError(f"the code does not parse: {exc.msg} (line {exc.lineno})") from None
        except CodeInterpreterError as exc:
            raise ToolError(str(exc)[:4000]) from None
        finally:
            interpreter.shutdown()
        return str(output if output is not None else "")


# -- recursion and the long-context modules -------------------------------------------------


def child_run(kit: ToolKit, task: RlmTask, call_id: str, index: int, what: str) -> RlmResult:
    """One child run of the chat run, on the session's sandbox, in the turn's tree."""
    ctx = kit.ctx
    run = child_run_id(ctx.run, call_id, index)
    kit.recorder.record(
        ChildRunRequested(
            child_run=run,
            task=what[:2000],
            call_id=call_id,
            batch_index=index,
            depth=ctx.depth + 1,
        )
    )
    child = RunContext(
        tenant=ctx.tenant, session=ctx.session, turn=ctx.turn, run=run, tree=ctx.tree,
        sandbox=kit.sandbox(), mesh=ctx.mesh, depth=ctx.depth + 1, parent_run=ctx.run,
        parent_call=call_id, cancel=ctx.cancel,
    )  # fmt: skip
    result = kit.engine(task, child)
    if result.status == "completed":
        kit.recorder.record(
            ChildRunCompleted(
                child_run=run,
                answer=result.answer[:RESULT_CHARS],
                child_head_hash=result.head_hash,
                call_id=call_id,
            )
        )
    else:
        kit.recorder.record(
            ChildRunFailed(
                child_run=run, error=result.error[:2000], child_head_hash=result.head_hash,
                call_id=call_id, cancelled=result.status == "cancelled",
                retryable=result.retryable,
            )
        )  # fmt: skip
    return result


class Recursion:
    def __init__(self, kit: ToolKit, documents: Documents) -> None:
        self.kit = kit
        self.documents = documents

    def child(self, task: RlmTask, call_id: str, index: int, what: str) -> RlmResult:
        return child_run(self.kit, task, call_id, index, what)

    def _task(
        self, inputs: dict[str, Any], signature: str = RLM_TURN, answer: str = "answer"
    ) -> RlmTask:
        base = self.kit.rlm_task
        return RlmTask(
            inputs=inputs, signature=signature, answer_field=answer, max_iters=base.max_iters,
            max_llm_calls=base.max_llm_calls, max_depth=base.max_depth,
            max_output_chars=base.max_output_chars, cell_wall_s=base.cell_wall_s,
        )  # fmt: skip

    def _answer(self, result: RlmResult) -> str:
        if result.status != "completed":
            raise ToolError(f"the RLM run {result.status}: {result.error[:500] or 'no answer'}")
        return result.answer

    def rlm_query(self, query: str, context: str = "") -> str:
        """Hand a task too big for one prompt to a recursive language model (it writes code
        in the sandbox to inspect `context`); answers its answer."""
        call_id = f"{self.kit.ctx.run}-t{self.kit.calls}"
        return self._answer(
            self.child(self._task({"task": query, "context": context}), call_id, 0, query)
        )

    def rlm_query_batched(self, tasks: list[str], context: str = "") -> list[str]:
        """Several independent rlm_query tasks over the same context, at most 4 at once."""
        call_id = f"{self.kit.ctx.run}-t{self.kit.calls}"
        with concurrent.futures.ThreadPoolExecutor(
            BATCH_LIMIT, thread_name_prefix="rlm-batch"
        ) as pool:
            futures = [
                pool.submit(self.child, self._task({"task": t, "context": context}), call_id, i, t)
                for i, t in enumerate(tasks)
            ]
            results = [f.result() for f in futures]
        return [r.answer if r.status == "completed" else f"error: {r.error[:300]}" for r in results]

    def delegate_to_rlm(
        self, query: str, context: str = "", document_alias: str = ""
    ) -> dict[str, Any]:
        """Delegate a task to a recursive language model, optionally over a loaded document;
        answers {status, answer, degraded, reason}."""
        if document_alias:
            context = (
                f"{context}\n\n{self.documents.text(document_alias)}"
                if context
                else self.documents.text(document_alias)
            )
        call_id = f"{self.kit.ctx.run}-t{self.kit.calls}"
        result = self.child(self._task({"task": query, "context": context}), call_id, 0, query)
        return {
            "status": result.status, "answer": result.answer,
            "degraded": result.status != "completed", "reason": result.error[:500],
        }  # fmt: skip

    def _module(self, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        signature, answer = LONG_CONTEXT[name]
        call_id = f"{self.kit.ctx.run}-t{self.kit.calls}"
        result = self.child(self._task(inputs, signature, answer), call_id, 0, name)
        self._answer(result)
        return result.outputs

    def summarize_long_document(self, focus: str = "", alias: str = "") -> dict[str, Any]:
        """SummarizeLongDocument over a loaded document: summary, key_points, coverage_pct."""
        return self._module(
            "SummarizeLongDocument", {"document": self.documents.text(alias), "focus": focus}
        )

    def extract_from_logs(self, query: str, alias: str = "") -> dict[str, Any]:
        """ExtractFromLogs over a loaded log document: matches, patterns, time_range."""
        return self._module("ExtractFromLogs", {"logs": self.documents.text(alias), "query": query})

    def grounded_answer(
        self, query: str, alias: str = "", response_style: str = "concise"
    ) -> dict[str, Any]:
        """GroundedAnswerWithCitations from a loaded document's chunks: answer, citations,
        confidence, coverage_notes."""
        text = self.documents.text(alias)
        evidence = [text[c.start : c.end] for c in docs.chunks(text)]
        return self._module(
            "GroundedAnswerWithCitations",
            {"query": query, "evidence_chunks": evidence, "response_style": response_style},
        )

    def triage_incident_logs(
        self, query: str, service_context: str = "", alias: str = ""
    ) -> dict[str, Any]:
        """IncidentTriageFromLogs: severity, probable_root_causes, impacted_components,
        recommended_actions, time_range."""
        return self._module(
            "IncidentTriageFromLogs",
            {
                "logs": self.documents.text(alias),
                "service_context": service_context,
                "query": query,
            },
        )

    def plan_code_change(
        self, task: str, repo_context: str = "", constraints: str = ""
    ) -> dict[str, Any]:
        """CodeChangePlan: plan_steps, files_to_touch, validation_commands, risks."""
        return self._module(
            "CodeChangePlan",
            {"task": task, "repo_context": repo_context, "constraints": constraints},
        )

    def propose_core_memory_update(self) -> dict[str, Any]:
        """CoreMemoryUpdateProposal over this session's turns: keep, update, remove, rationale
        (a proposal only: apply it with core_memory_append / core_memory_replace)."""
        memory = self.kit.state.memory
        return self._module(
            "CoreMemoryUpdateProposal",
            {
                "turn_history": self.kit.state.history,
                "current_memory": {
                    b: getattr(memory, b) for b in ("persona", "human", "scratchpad")
                },
            },
        )


# -- asking the user -----------------------------------------------------------------------


class Clarify:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def ask_user(self, question: str, options: list[str] | None = None) -> str:
        """Ask the user a question and wait for the answer (free text, or one of `options`).
        Use only when the message cannot be answered without them."""
        kit = self.kit
        request_id = new_id()
        chosen = tuple(str(o)[:200] for o in (options or ())[:10])
        seq = kit.log(
            InputRequested(
                request_id=request_id,
                question=question[:2000],
                options=chosen,
                timeout_s=kit.clarify_timeout_s,
            )
        )
        if kit.park:
            raise ParkTurn(request_id)
        answer = kit.ctx.mesh.bus.run(
            wait_for_answer(
                kit.ctx.mesh, kit.scope, request_id, after_seq=seq,
                timeout_s=kit.clarify_timeout_s, cancel=kit.ctx.cancel,
            ),
            timeout=kit.clarify_timeout_s + 30,
        )  # fmt: skip
        if answer is None:
            if kit.ctx.cancel.is_set:
                raise ToolError("the turn was cancelled while waiting for the user")
            kit.log(
                InputExpired(
                    request_id=request_id, reason=f"no answer in {kit.clarify_timeout_s:g}s"
                )
            )
            raise ToolError(
                f"the user did not answer in {kit.clarify_timeout_s:g}s: go on without it"
            )
        if isinstance(answer, InputExpired):
            raise ToolError("the question expired unanswered: go on without it")
        return f"{answer.answer} (option: {answer.option})" if answer.option else answer.answer


def toolset(kit: ToolKit) -> list[dspy.Tool]:
    """The turn's tools, by its mode (module docstring)."""
    documents = Documents(kit)
    memory = Memory(kit)
    sandbox = Sandbox(kit)
    recursion = Recursion(kit, documents)
    clarify = Clarify(kit)
    chosen: list[Callable[..., Any]] = [
        documents.load_document, documents.fetch_web_document, documents.list_documents,
        documents.set_active_document, documents.read_file_slice, documents.find_in_document,
        documents.chunk_host, memory.core_memory_append, memory.core_memory_replace,
        memory.memory_write, memory.memory_read, memory.memory_list, sandbox.execute_code,
        sandbox.list_files, sandbox.workspace_read, sandbox.workspace_write, clarify.ask_user,
    ]  # fmt: skip
    if kit.mode != "tools_only":
        chosen += [
            recursion.rlm_query, recursion.rlm_query_batched, recursion.delegate_to_rlm,
            recursion.summarize_long_document, recursion.extract_from_logs,
            recursion.grounded_answer, recursion.triage_incident_logs,
            recursion.plan_code_change, recursion.propose_core_memory_update,
        ]  # fmt: skip
    return [recorded(kit, fn.__name__, fn) for fn in chosen]


__all__ = [
    "Engine",
    "ToolError",
    "ToolKit",
    "TurnState",
    "listing",
    "recorded",
    "toolset",
]
