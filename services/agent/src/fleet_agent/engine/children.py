"""`sub_rlm` and `sub_rlm_batched`: host tools that run a sub-task as a child run of the tree.

For each child, the parent (in the tool call's thread, its cell blocked on the answer):

1. asks the budget to admit it (`budget.admit`: the tree's depth limit); a refusal is the
   tool's answer, with the ledger's message;
2. records `run.child_requested`, asks the broker for a child sandbox (`build_child`: the
   isolation policy picks fork, clean or context, and records which), and publishes the child
   run as a work item (`fleet.work.agent.child_run`, `Nats-Msg-Id` the child run id, so any
   replica runs it once);
3. waits, its work slot lent back, for the child run's terminal event on the child's own run
   subject, no longer than the tree's deadline;
4. records `run.child_completed` with the child chain's head hash (or `run.child_failed`) and
   returns only the child's answer.

The child's replica deletes the child sandbox when the child run ends (`child_worker`), so a
parent that died meanwhile leaves nothing behind; the parent deletes it itself only when it
stops waiting on a child that has not ended (deadline, cancel past the grace).

Ids are derived (child run from parent run, tool call and batch position; admit and build
request ids from the child run), so a resumed parent (issue 16) asks for the same children
and every service answers it as the first time.
"""

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

from fleet_agent.engine.model import RlmTask, RunContext, child_run_id, derived_id
from fleet_agent.engine.recorder import TOOL_CALL, RunRecorder
from fleet_agent.engine.resume import Resume
from fleet_events import bus, new_id, streams
from fleet_events import sandbox as sb
from fleet_events.budget import AdmitChild
from fleet_events.catalog import type_of_class
from fleet_events.chain import HASH_HEADER, PREV_HEADER, TYPE_HEADER
from fleet_events.codec import CodecError
from fleet_events.run import (
    CHILD_RUN_WORK_SUBJECT,
    TERMINAL,
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    ChildRunWork,
    RunCancelled,
    RunCompleted,
    RunFailed,
)
from fleet_events.session import run_subject
from fleet_mesh import rpc
from fleet_mesh.store import StoredEvent

MAX_SIBLINGS = 4
"""Children of one `sub_rlm_batched` call running at once (DESIGN.md §5)."""

CANCEL_GRACE_S = 30.0
"""How long a cancelled parent still waits for its children to record their own end (they
see the same turn's cancel) before it reaps their sandboxes itself."""

DEFAULT_DEADLINE_S = 3600.0

RECHECK_S = 5.0
REACH_S = 15.0
"""How long a request met by "no responders" is sent again (the budget or broker service
reconnecting after a NATS restart holds no subscription for a moment)."""
"""A waiting parent reads the child's stored tail at least this often (a core message missed
across a reconnect would otherwise leave it waiting until the deadline)."""

TERMINAL_TYPES = frozenset(type_of_class(cls) for cls in TERMINAL)

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class ChildOutcome:
    child_run: str
    answer: str | None
    error: str = ""


class ChildRuns:
    """The child-run host tools of one run."""

    def __init__(
        self, task: RlmTask, ctx: RunContext, recorder: RunRecorder, resume: Resume | None = None
    ) -> None:
        self.task = task
        self.ctx = ctx
        self.recorder = recorder
        self.resume = resume
        self._active = 0
        self._settled = threading.Condition()

    def idle(self, timeout: float) -> bool:
        """Wait until no call of this run is spawning or waiting on children."""
        with self._settled:
            return self._settled.wait_for(lambda: self._active == 0, timeout)

    def tools(self) -> list[Callable[..., Any]]:
        def sub_rlm(task: str) -> str:
            """Run `task` (a self-contained instruction with the data it needs, as text) as
            a recursive sub-agent in a sandbox of its own; returns its answer."""
            (outcome,) = self._spawn([task])
            if outcome.answer is None:
                raise RuntimeError(outcome.error)
            return outcome.answer

        def sub_rlm_batched(tasks: list[str]) -> list[str]:
            """Run several `sub_rlm` tasks (at most 4 at once); returns their answers in order,
            an "[ERROR] ..." string in place of a child that gave none."""
            return [
                o.answer if o.answer is not None else f"[ERROR] {o.error}"
                for o in self._spawn(tasks)
            ]

        return [sub_rlm, sub_rlm_batched]

    # -- one call ----------------------------------------------------------------------------

    def _spawn(self, tasks: list[str]) -> list[ChildOutcome]:
        if not isinstance(tasks, list) or not all(isinstance(t, str) and t.strip() for t in tasks):
            raise TypeError("sub_rlm takes a non-empty task string; sub_rlm_batched a list of them")
        call = getattr(TOOL_CALL, "current", None)
        call_id, context = call if call else (new_id(), self.ctx.context or "")
        slot = self.ctx.slot
        with self._settled:
            self._active += 1
        if slot is not None:
            slot.begin_wait()
        try:
            if len(tasks) == 1:
                return [self._child(call_id, context, 0, tasks[0])]
            with ThreadPoolExecutor(max_workers=MAX_SIBLINGS, thread_name_prefix="sub-rlm") as pool:
                futures = [
                    pool.submit(self._child, call_id, context, index, text)
                    for index, text in enumerate(tasks)
                ]
                return [f.result() for f in futures]
        finally:
            if slot is not None:
                slot.end_wait()
            with self._settled:
                self._active -= 1
                self._settled.notify_all()

    def _child(self, call_id: str, context: str, index: int, text: str) -> ChildOutcome:
        ctx = self.ctx
        child_run = child_run_id(ctx.run, call_id, index)
        depth = ctx.depth + 1
        ended_before = self.resume.child(child_run) if self.resume is not None else None
        if ended_before is not None:  # its end is in this run's record: not asked again
            return ChildOutcome(child_run, ended_before.answer, ended_before.error)
        record = self.recorder.record
        requested = ChildRunRequested(
            child_run=child_run, task=text[:4000], call_id=call_id, batch_index=index, depth=depth
        )
        if self.recorder.recorded(requested) and self._started(child_run):
            # asked for by the holder this run was resumed from, and running (or run): its
            # work item is taken; wait for its end as that holder would have
            return self._settle(child_run, call_id)
        record(requested)
        admit = AdmitChild(
            request_id=derived_id("admit", child_run),
            tree=ctx.tree,
            parent_run=ctx.run,
            child_run=child_run,
            depth=depth,
        )
        admitted = ctx.mesh.bus.call(bus.ADMIT_CHILD, admit, timeout=15, reach_s=REACH_S)
        if not admitted.admitted:
            return self._failed(child_run, call_id, admitted.message or admitted.reason)
        try:
            child = ctx.mesh.bus.call(
                bus.BUILD_CHILD,
                sb.BuildChild(
                    request_id=derived_id("build", child_run),
                    tenant=ctx.tenant,
                    sandbox=ctx.sandbox,
                    context=context,
                    labels={"session": ctx.session, "run": child_run, "role": "child"},
                ),
                target=ctx.sandbox,
                timeout=120,
                reach_s=REACH_S,
            )
        except rpc.RemoteError as exc:
            return self._failed(child_run, call_id, f"no child sandbox: {exc.code}: {exc.message}")
        work = self._work(child_run, call_id, depth, text, child)
        fresh = ctx.mesh.bus.run(self._publish(child_run, work), timeout=15)
        if not fresh:  # a resumed parent built a second sandbox for a child already queued
            with contextlib.suppress(Exception):
                ctx.mesh.bus.delete_sandbox(child.sandbox)
            return self._settle(child_run, call_id)
        return self._settle(child_run, call_id, child.sandbox)

    def _started(self, child_run: str) -> bool:
        ctx = self.ctx
        subject = run_subject(ctx.tenant, ctx.session, child_run)
        return ctx.mesh.bus.run(ctx.mesh.store.last(subject), timeout=15) is not None

    def _settle(self, child_run: str, call_id: str, sandbox: str = "") -> ChildOutcome:
        """Wait for the child's end and record it; a child that does not end in time is
        reaped here (its sandbox, when this call built it)."""
        ctx = self.ctx
        ended = self._wait(child_run)
        if ended is None:
            if sandbox:
                with contextlib.suppress(Exception):
                    ctx.mesh.bus.delete_sandbox(sandbox)
            why = "cancelled" if ctx.cancel.is_set else "no answer before the tree's deadline"
            return self._failed(
                child_run, call_id, f"child run {child_run}: {why}", cancelled=ctx.cancel.is_set
            )
        return self._ended(child_run, call_id, ended)

    def _work(
        self, child_run: str, call_id: str, depth: int, text: str, child: sb.ChildSandbox
    ) -> ChildRunWork:
        ctx, task = self.ctx, self.task
        return ChildRunWork(
            tenant=ctx.tenant,
            session=ctx.session,
            turn=ctx.turn,
            tree=ctx.tree,
            parent_run=ctx.run,
            child_run=child_run,
            call_id=call_id,
            depth=depth,
            task=text,
            sandbox=child.sandbox,
            context=child.context,
            branch=child.branch,
            max_iters=task.max_iters,
            max_llm_calls=task.max_llm_calls,
            max_output_chars=task.max_output_chars,
            planner_role=task.planner_role,
            delegate_role=task.delegate_role,
            deadline=self._deadline(),
        )

    def _deadline(self) -> float:
        return self.ctx.deadline or time.time() + DEFAULT_DEADLINE_S

    async def _publish(self, child_run: str, work: ChildRunWork) -> bool:
        """Publish the child's work item; False when the stream already held it (dedup)."""
        js = self.ctx.mesh.bus.nc.jetstream()
        ack = await js.publish(
            CHILD_RUN_WORK_SUBJECT,
            _encode(work),
            stream=streams.WORK.name,
            headers={"Nats-Msg-Id": f"child.{child_run}"},
            timeout=10,
        )
        return not ack.duplicate

    # -- waiting -----------------------------------------------------------------------------

    def _wait(self, child_run: str) -> StoredEvent | None:
        ctx = self.ctx
        subject = run_subject(ctx.tenant, ctx.session, child_run)
        loop_box: list[asyncio.AbstractEventLoop] = []
        stop: list[asyncio.Event] = []

        async def wait() -> StoredEvent | None:
            loop_box.append(asyncio.get_running_loop())
            stopped = asyncio.Event()
            stop.append(stopped)
            release = ctx.cancel.on_set(lambda: loop_box[0].call_soon_threadsafe(stopped.set))
            try:
                return await wait_for_end(ctx, subject, self._deadline(), stopped)
            finally:
                release()

        remaining = max(1.0, self._deadline() - time.time())
        return ctx.mesh.bus.run(wait(), timeout=remaining + CANCEL_GRACE_S + 30)

    def _ended(self, child_run: str, call_id: str, ended: StoredEvent) -> ChildOutcome:
        data = ended.envelope.data
        if isinstance(data, RunCompleted):
            self.recorder.record(
                ChildRunCompleted(
                    child_run=child_run,
                    answer=data.answer,
                    child_head_hash=ended.hash,
                    call_id=call_id,
                )
            )
            return ChildOutcome(child_run, data.answer)
        if isinstance(data, RunCancelled):
            return self._failed(
                child_run,
                call_id,
                f"child run {child_run} was cancelled",
                head=ended.hash,
                cancelled=True,
            )
        error = data.error if isinstance(data, RunFailed) else "ended without an answer"
        retryable = data.retryable if isinstance(data, RunFailed) else False
        return self._failed(
            child_run,
            call_id,
            f"child run {child_run} failed: {error}",
            head=ended.hash,
            retryable=retryable,
        )

    def _failed(
        self,
        child_run: str,
        call_id: str,
        error: str,
        *,
        head: str = "",
        cancelled: bool = False,
        retryable: bool = False,
    ) -> ChildOutcome:
        self.recorder.record(
            ChildRunFailed(
                child_run=child_run,
                error=error,
                child_head_hash=head,
                call_id=call_id,
                cancelled=cancelled,
                retryable=retryable,
            )
        )
        return ChildOutcome(child_run, None, error)


async def wait_for_end(
    ctx: RunContext, subject: str, deadline: float, stopped: asyncio.Event
) -> StoredEvent | None:
    """The run's terminal event, once stored; None past `deadline`, or past the cancel grace
    once `stopped` is set. Runs on the bus loop: core NATS sees each message the stream
    stores, and the subscription is taken before the stored tail is read, so an end stored
    in between is seen either way."""
    arrived = asyncio.Event()
    ends: list[StoredEvent] = []

    async def on_message(msg: Any) -> None:
        headers = msg.headers or {}
        if headers.get(TYPE_HEADER) not in TERMINAL_TYPES:
            return
        # the end as it was stored, from the message itself: a read of the stream's last
        # message right after can still answer the one before it
        with contextlib.suppress(CodecError):
            envelope = await ctx.mesh.codec.decode(msg.data, tenant=ctx.tenant)
            ends.append(
                StoredEvent(
                    subject, 0, envelope, headers.get(HASH_HEADER, ""), headers.get(PREV_HEADER, "")
                )
            )
        arrived.set()

    sub = await ctx.mesh.bus.nc.subscribe(subject, cb=on_message)
    # the server must hold the subscription before the tail is read, or an end stored in
    # between is seen by neither
    await ctx.mesh.bus.nc.flush(timeout=10)
    try:
        grace_until: float | None = None
        while True:
            if ends:
                stored = await _confirmed(ctx, subject, ends.pop(0))
                if stored is not None:
                    return stored
            last = await ctx.mesh.store.last(subject)
            if last is not None and isinstance(last.envelope.data, TERMINAL):
                return last
            now = time.time()
            if stopped.is_set() and grace_until is None:
                grace_until = now + CANCEL_GRACE_S
            until = min(deadline, grace_until) if grace_until is not None else deadline
            if now >= until:
                return None
            # a message lost across a reconnect is not redelivered: read the tail again
            until = min(until, now + RECHECK_S)
            waiters = [asyncio.ensure_future(arrived.wait())]
            if grace_until is None:
                waiters.append(asyncio.ensure_future(stopped.wait()))
            _, pending = await asyncio.wait(
                waiters, timeout=max(0.0, until - now), return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()
            arrived.clear()
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


CONFIRM_TRIES = 40
CONFIRM_EVERY_S = 0.05


async def _confirmed(ctx: RunContext, subject: str, seen: StoredEvent) -> StoredEvent | None:
    """The end a core message announced, once the stream shows it stored (a publish the
    stream refused, e.g. a fenced holder's, reaches core subscribers all the same). The
    stream's last message can lag the message by a moment: a bounded re-read."""
    for _ in range(CONFIRM_TRIES):
        last = await ctx.mesh.store.last(subject)
        if last is not None and last.hash == seen.hash:
            return last
        if last is not None and isinstance(last.envelope.data, TERMINAL):
            return last
        await asyncio.sleep(CONFIRM_EVERY_S)
    return None
