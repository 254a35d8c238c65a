"""What every chat tool stands on: the turn's `ToolKit` and `TurnState`, the recording wrapper
that puts each call and result on the run's record (`recorded`), the tool's answer when it
cannot do what was asked (`ToolError`), and the sandbox's files as tools read and write them.
"""

import contextlib
import functools
import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import dspy
from pydantic_core import to_jsonable_python

from fleet_agent.chat.session_log import LogScope, append
from fleet_agent.chat.urls import UrlLoader
from fleet_agent.engine.model import RlmResult, RlmTask, RunContext
from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.run.failures import InputError
from fleet_events import Event, new_id
from fleet_events.run import ToolCalled, ToolReturned
from fleet_events.session import CoreMemory, DocumentRef, MemoryFile
from fleet_mesh.rpc import RemoteError

RESULT_CHARS = 16_000
BATCH_LIMIT = 4


class ToolError(InputError):
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


E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Logged(Generic[E]):
    """A session fact as it stands on the log: its stream sequence and the event."""

    seq: int
    event: E


def fact_id(run: str, call_id: str, n: int) -> str:
    """The envelope id of the `n`th session fact tool call `call_id` of `run` logs: the same
    on every attempt, so the call run again (the one a dead holder left in flight) finds its
    facts stored under it, and JetStream's duplicate window drops a second append."""
    return hashlib.sha256(f"{run}/{call_id}/{n}".encode()).hexdigest()[:32]


@dataclass
class _Calling:
    call_id: str
    facts: int = 0


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
    returned: dict[str, ToolReturned] = field(default_factory=dict)
    """The results a taken-over run's record holds, by call id: a call made again under a
    recorded id is answered from here and does not run again."""
    stored: "dict[str, Logged[Event]]" = field(default_factory=dict)
    """The session facts this run's tool calls stored (by envelope id, `fact_id`), read when
    the run was taken over: a call run again finds the facts it logged before and logs none
    twice (the fact that stands is the stored one, and the tool mirrors that)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)

    @property
    def scope(self) -> LogScope:
        return LogScope(self.ctx.tenant, self.ctx.session, self.ctx.turn, self.ctx.run)

    def log(self, event: E) -> Logged[E]:
        """Append a session fact to the log (under the tool call that makes it, `fact_id`);
        the fact as it stands: the one this call stored on an earlier attempt, if any."""
        calling: _Calling | None = getattr(self._local, "calling", None)
        if calling is None:  # not inside a recorded call (a tool's own helper thread)
            event_id, causation = new_id(), None
        else:
            calling.facts += 1
            event_id = fact_id(self.ctx.run, calling.call_id, calling.facts)
            causation = calling.call_id
            stood = self.stored.get(event_id)
            if stood is not None and type(stood.event) is type(event):
                return cast(Logged[E], stood)
            if stood is not None:  # decided otherwise this time: a fact of its own, kept
                event_id = new_id()
        appended = self.ctx.mesh.bus.run(
            append(self.ctx.mesh, self.scope, event, event_id=event_id, causation=causation),
            timeout=30,
        )
        return Logged(appended.seq, event)

    @contextlib.contextmanager
    def calling(self, call_id: str) -> Iterator[None]:
        """The facts logged inside are tool call `call_id`'s (this thread's)."""
        outer = getattr(self._local, "calling", None)
        self._local.calling = _Calling(call_id)
        try:
            yield
        finally:
            self._local.calling = outer

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
        done = kit.returned.get(call_id)
        if done is not None and done.tool == name:  # on the record already: not run again
            return done.result
        kit.recorder.record(  # a call the record holds begun (in flight) is not recorded twice
            ToolCalled(call_id=call_id, tool=name, args=_shown(dict(bound.arguments)))
        )
        started = time.monotonic()
        error = ""
        try:
            with kit.calling(call_id):
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


__all__ = [
    "BATCH_LIMIT",
    "RESULT_CHARS",
    "Engine",
    "Logged",
    "ParkTurn",
    "ToolError",
    "ToolKit",
    "TurnState",
    "fact_id",
    "read_sandbox_file",
    "recorded",
    "write_sandbox_file",
]
