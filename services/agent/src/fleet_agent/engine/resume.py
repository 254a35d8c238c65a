"""Resume a run from its record: what a later attempt reuses instead of paying for again.

A run's subject is its journal (`fleet_events.journal`). An attempt that finds it non-empty
(the last holder died, or froze past its ack deadline) runs the same module with the same
inputs, and at each seam answers from the record while the run does what it did before:

- a model call whose request digest matches an unused recorded call gets that call's response
  (no grant, no provider call, nothing appended: the record has it); the first call with no
  recorded match goes to the model, under a grant id past every recorded one;
- a cell whose position and code match a recorded cell gets that cell's answer (it is not sent
  to the sandbox); the first cell that does not match runs, in the same REPL context, after any
  cell the dead holder left running there is interrupted;
- a host tool call (`sub_rlm`...) whose deterministic id (`<cell>-t<n>`) is recorded as
  returned gets the recorded result; a child run recorded as ended gives its recorded answer.

Every step append is keyed (`journal.step_key`): a key the record holds is not appended
again, so a resumed run stores no event twice. The one step that runs again is the one in
flight when the holder died (docs/turns.md, "Which step repeats").
"""

import threading
from dataclasses import dataclass
from typing import Any

from dspy.lm15 import Message, Response, Usage

from fleet_agent.engine.model import RunContext
from fleet_events import journal as jr
from fleet_events.envelope import BlobRef
from fleet_events.session import run_subject
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EMPTY, Head


@dataclass(frozen=True)
class LoadedJournal:
    journal: jr.Journal
    head: Head


async def load_journal(ctx: RunContext) -> LoadedJournal:
    """The run's record, folded, with the head the next append is made against (on the bus
    loop)."""
    subject = run_subject(ctx.tenant, ctx.session, ctx.run)
    journal = jr.Journal()
    head = EMPTY
    async for stored in ctx.mesh.store.replay(subject):
        jr.evolve(journal, stored.envelope.data)
        head = Head(stored.seq, stored.hash)
    return LoadedJournal(journal, head)


class Resume:
    """The record one attempt reuses; shared by the seams of one run, from dspy's threads."""

    def __init__(self, ctx: RunContext, journal: jr.Journal) -> None:
        self.ctx = ctx
        self.journal = journal
        self._lock = threading.Lock()
        self._unused = list(journal.calls)
        self.reused_calls = 0
        self.reused_cells = 0
        self.cleared_contexts: set[str] = set()

    @property
    def active(self) -> bool:
        return self.journal.events > 0

    # -- model calls -------------------------------------------------------------------------

    @property
    def calls_left(self) -> bool:
        with self._lock:
            return bool(self._unused)

    def take_call(self, digest: str, index: int | None = None) -> jr.RecordedCall | None:
        """The first unused recorded call with this request digest (the one at `index` first)."""
        with self._lock:
            found = [c for c in self._unused if c.request_hash == digest]
            if not found:
                return None
            at_index = [c for c in found if c.index == index]
            call = at_index[0] if at_index else found[0]
            self._unused.remove(call)
            self.reused_calls += 1
            return call

    def response(self, call: jr.RecordedCall, model: str) -> Response:
        text = self.text(call.response)
        return Response(
            id=None, model=model, message=Message.assistant(text), finish_reason="stop",
            usage=Usage(input_tokens=0, output_tokens=0),
        )  # fmt: skip

    # -- payloads ----------------------------------------------------------------------------

    def text(self, value: str | BlobRef | None) -> str:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        return self.blob(value).decode()

    def blob(self, ref: BlobRef) -> bytes:
        bus = self.ctx.mesh.bus

        async def get() -> bytes:
            blobs = await JetStreamBlobs.open(bus.nc.jetstream())
            return await blobs.get(self.ctx.tenant, ref.sha256)

        return bus.run(get(), timeout=60)

    def stdout(self, cell: jr.RecordedCell) -> str:
        if cell.stdout_blob is not None:
            return self.blob(cell.stdout_blob).decode()
        return cell.stdout

    # -- cells, tools, children --------------------------------------------------------------

    def reuse_cell(self) -> None:
        with self._lock:
            self.reused_cells += 1

    def tool(self, call_id: str) -> jr.RecordedTool | None:
        tool = self.journal.tools.get(call_id)
        return tool if tool is not None and tool.returned else None

    def child(self, child_run: str) -> jr.RecordedChild | None:
        child = self.journal.children.get(child_run)
        return child if child is not None and child.ended else None

    def first_live_in(self, context: str) -> bool:
        """True once per context: the first live cell there clears what the last holder left
        running in it."""
        with self._lock:
            if not self.active or context in self.cleared_contexts:
                return False
            self.cleared_contexts.add(context)
            return True


def recorded_answer(resume: Resume, cell: jr.RecordedCell) -> tuple[str, Any]:
    """What the interpreter answered for a recorded cell: (outcome, value or message)."""
    if cell.outcome == "final":
        return "final", cell.final
    if cell.outcome == "result":
        stdout = resume.stdout(cell)
        return "result", cell.value if cell.value is not None else (stdout or None)
    message = cell.error.split(": ", 1)[1] if ": " in cell.error else cell.error
    return cell.outcome, message
