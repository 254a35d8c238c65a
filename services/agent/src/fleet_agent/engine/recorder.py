"""The run's record: every step appended to `fleet.session.<t>.<s>.run.<run>` as it happens.

Appends are made against the head this recorder last wrote (`expect=`), one at a time under a
lock, from whichever thread dspy is on: the run subject has one writer, so a head that moved
means another replica holds the run now, and the recorder raises `RunFenced` instead of
writing a fork of its chain. Positions (`index` of a model call, `cell_id` of a cell) are
handed out here, in the order things happen, so a resumed run can find each result again by
its place in the run (docs/agent.md, "Resume and replay").

Request messages and responses over `INLINE_BYTES` go to the object store and the event
carries a `BlobRef`: token and cost fields stay readable to projections that never fetch a
prompt, and the envelope stays small.
"""

import asyncio
import threading
from typing import Any

import msgspec

from fleet_agent.engine.model import RunContext, RunFenced
from fleet_events import Envelope, Event, new_id, utc_now
from fleet_events.bus import LiveDelta
from fleet_events.envelope import BlobRef
from fleet_events.journal import Journal, RecordedCell, step_key
from fleet_events.run import LlmCalled
from fleet_events.session import run_subject
from fleet_events.subjects import live
from fleet_mesh.store import EMPTY, AppendConflict, Head

TOOL_CALL = threading.local()
"""`current`: (call id, REPL context) of the host tool call this thread is running, for the
tools that record against it (`sub_rlm`)."""

INLINE_BYTES = 32 * 1024
APPEND_TIMEOUT_S = 30.0

_json = msgspec.json.Encoder()


class RunRecorder:
    """The run's one writer. Given the run's `journal` (a resumed attempt), it appends after
    the recorded head, skips every step the record already holds (`step_key`), and hands out
    positions past the recorded ones for what runs live."""

    def __init__(self, ctx: RunContext, journal: Journal | None = None, head: Head = EMPTY) -> None:
        self.ctx = ctx
        self.subject = run_subject(ctx.tenant, ctx.session, ctx.run)
        self.head: Head = head
        self.journal = journal or Journal()
        self.events = 0
        self.skipped = 0
        self.fenced = False
        self._held: list[Event] = []
        """Events appended with the next one (`hold`), in one atomic batch."""
        """Another holder appended: this one records nothing more, and leaves the REPL context
        (now the other holder's) open."""
        self._lock = threading.Lock()  # positions only; never held across an await
        self._append_lock: asyncio.Lock | None = None
        self._counter = self.journal.max_call_index
        self._cells = 0
        self._cells_diverged = False
        self._tools: dict[str, int] = {}
        self.llm_calls = 0
        self.counts_reused = True
        """A reused call adds to `llm_calls` (False: the caller counted the record's calls)."""
        self.current_cell = ""
        self.last_step_call = ""

    # -- positions ---------------------------------------------------------------------------

    def next_grant_id(self) -> str:
        """The grant id of the run's next live model call (past every recorded one); its
        `index` is read back from it."""
        with self._lock:
            self._counter += 1
            return f"{self.ctx.run}-g{self._counter}"

    def next_cell(self, code: str) -> tuple[str, RecordedCell | None]:
        """The next cell's id, and its recorded result when the record holds this cell at this
        position with this code. Once a cell differs from the record, every later cell is live
        and numbered past the recorded ones (their ids must not meet recorded keys)."""
        recorded_code = code if len(code.encode()) <= INLINE_BYTES else code[:INLINE_BYTES]
        with self._lock:
            self._cells += 1
            if not self._cells_diverged:
                cell = self.journal.cell(self._cells)
                if cell is not None and cell.code == recorded_code:
                    return cell.cell_id, cell
                if cell is not None:
                    self._cells_diverged = True
                    self._cells = len(self.journal.cells) + 1
            return f"{self.ctx.run}-c{self._cells}", None

    def next_tool_call(self, cell: str) -> str:
        """A host tool call's id, fixed by its cell and its place among that cell's calls, so
        a resumed cell's calls (and the child runs they ask for) have the ids they had."""
        with self._lock:
            n = self._tools.get(cell, 0) + 1
            self._tools[cell] = n
            return f"{cell}-t{n}"

    def reused_call(self, call_id: str, kind: str) -> None:
        """A model call answered from the record: counted, and a step call is the plan's."""
        with self._lock:
            if self.counts_reused:
                self.llm_calls += 1
            if kind == "step":
                self.last_step_call = call_id

    # -- appends -----------------------------------------------------------------------------

    def recorded(self, event: Event) -> bool:
        """Does the run's record already hold the step `event` records?"""
        key = step_key(event)
        return key is not None and key in self.journal.keys

    def hold(self, event: Event) -> None:
        """Keep `event` to be appended with the next one, in one atomic batch: for an event
        whose loss costs nothing a resume would not repeat anyway (a step call's
        `run.llm_called`, followed at once by its `run.iteration_planned`: a death between the
        two leaves that step in flight either way, docs/turns.md, "Which step repeats")."""
        if self.recorded(event):
            self.skipped += 1
            return
        with self._lock:
            self._held.append(event)

    def record(self, event: Event) -> Head:
        """Append from a dspy thread (never from the bus's own loop), with any held events
        before it; a step the record holds is not appended again."""
        if self.recorded(event) and not self._held:
            self.skipped += 1
            return self.head
        return self.ctx.mesh.bus.run(self._append(event), timeout=APPEND_TIMEOUT_S)

    async def arecord(self, event: Event) -> Head:
        """Append from a coroutine on any loop but the bus's."""
        if self.recorded(event) and not self._held:
            self.skipped += 1
            return self.head
        future = self.ctx.mesh.bus.submit(self._append(event))
        return await asyncio.wrap_future(future)

    async def _append(self, event: Event) -> Head:
        ctx = self.ctx
        # one writer per run: appends run on the bus loop, one at a time, in the order made
        if self._append_lock is None:
            self._append_lock = asyncio.Lock()
        async with self._append_lock:
            with self._lock:
                events, self._held = self._held, []
            if self.recorded(event):
                self.skipped += 1
            else:
                events.append(event)
            if not events:
                return self.head
            envelopes = [self._envelope(each) for each in events]
            try:
                appended = await ctx.mesh.store.append_batch(
                    self.subject, envelopes, expect=self.head
                )
            except AppendConflict as exc:
                self.fenced = True
                raise RunFenced(
                    f"run {ctx.run} was appended to by another holder: this replica stops"
                ) from exc
            self.head = appended[-1].head
            self.events += len(appended)
            return self.head

    def _envelope(self, event: Event) -> Envelope[Event]:
        ctx = self.ctx
        return Envelope(
            id=new_id(), tenant=ctx.tenant, session=ctx.session, turn=ctx.turn, run=ctx.run,
            parent_run=ctx.parent_run, actor=ctx.mesh.actor, ts=utc_now(), data=event,
            correlation=ctx.turn,
        )  # fmt: skip

    # -- model calls -------------------------------------------------------------------------

    def on_llm_call(self, event: LlmCalled) -> None:
        """What the budgeted LM hands over after each call: placed, offloaded, appended."""
        index = int(event.grant_id.rsplit("-g", 1)[1]) if "-g" in event.grant_id else 0
        messages: Any = event.messages
        response: Any = event.response
        if len(_json.encode(messages)) > INLINE_BYTES:
            messages = self._blob(_json.encode(messages))
        if isinstance(response, str) and len(response.encode()) > INLINE_BYTES:
            response = self._blob(response.encode())
        call_id = f"{self.ctx.run}-l{index}"
        with self._lock:
            self.llm_calls += 1
            if event.request_kind == "step":
                self.last_step_call = call_id
        placed = msgspec.structs.replace(
            event,
            call_id=call_id,
            index=index,
            cell=self.current_cell,
            messages=messages,
            response=response,
        )
        if event.request_kind == "step" and not event.error:
            self.hold(placed)  # goes with the plan (or the end) the step's answer makes
        else:
            self.record(placed)  # a sub call's response is reused by a re-run cell: at once

    def _blob(self, data: bytes) -> BlobRef:
        return self.ctx.mesh.bus.put_blob(data)

    # -- live deltas -------------------------------------------------------------------------

    def live(self, kind: str, text: str) -> None:
        """An unpersisted delta on the session's live subject (the persisted event follows)."""
        delta = LiveDelta(kind=kind, run=self.ctx.run, text=text)
        subject = live(self.ctx.tenant, self.ctx.session)
        nc = self.ctx.mesh.bus.nc
        self.ctx.mesh.bus.run(nc.publish(subject, _json.encode(delta)), timeout=5)
