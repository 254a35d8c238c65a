"""The journal-backed LM: a resumed run's model calls answered from its record while they match.

It wraps the budgeted LM (`fleet_agent.lm`, not changed): for each call it computes the digest
the budgeted LM would record (`run.request_digest` over the profile's model and the request
as sent, after `lm._with_profile_limits`, the same function the budgeted LM sends through),
and when an unused recorded call has that digest it answers with the recorded response: no
grant, no provider call, no usage, nothing appended (the record holds the call already). A
call with no recorded match goes to the budgeted LM, whose grant id comes from the recorder,
past every recorded index, so a live call never takes a recorded call's key. A recorded
failure the LM asked again (`retry_in_s`) is passed over for the retry recorded after it; one
that ended the call raises again with its recorded kind.

Each recorded call answered here sends its usage report again, as recorded and under the same
request id: the budgeted LM does not wait for a report before the call's answer is used (and
recorded), so a replica that died just then may have taken the report with it. The budget
answers a report it already holds by its id and counts nothing twice.
"""

import asyncio
from typing import Any

import dspy
from dspy.lm15 import Request, Response

from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.engine.resume import Resume
from fleet_agent.llm_failures import LLM_FAILURES, LlmFailure
from fleet_agent.lm import (
    BudgetedEngine,
    LmCallFailed,
    _messages,
    _with_profile_limits,
    call_site,
)
from fleet_events.budget import RecordUsage
from fleet_events.journal import RecordedCall
from fleet_events.run import request_digest


class JournalEngine:
    """dspy's sync engine protocol: recorded answers first, then the budgeted LM."""

    def __init__(self, inner: BudgetedEngine, resume: Resume, recorder: RunRecorder) -> None:
        self.inner = inner
        self.resume = resume
        self.recorder = recorder

    def complete(self, request: Request) -> Response:
        if not self.resume.calls_left:
            return self.inner.complete(request)
        stored, _ = self.inner.runner.run(self.inner._resolve(), timeout=30)
        model = stored.profile.model
        messages, params = _messages(_with_profile_limits(request, stored.profile))
        digest = request_digest(model, messages, params)
        call = self.resume.take_call(digest)
        retried = 0
        while call is not None and call.retried:  # the LM asked again: the retry answers
            self._reuse(call)
            retried += 1
            call = self.resume.take_call(digest)
        if call is None:  # the holder died before the retry: it is made live, as one more
            return self.inner.complete(request, retries_made=retried)
        self._reuse(call)
        if call.error:  # the recorded call failed: it fails the same way, in the same words
            known = call.error_code in LLM_FAILURES
            site = call_site(stored.profile, self.inner.scope.role)
            failure = (
                LlmFailure(
                    code=call.error_code, site=site, status=call.http_status or None,
                    retry_after_s=call.retry_after_s,
                )
                if known
                else None
            )  # fmt: skip
            raise LmCallFailed(call.error, failure)
        return self.resume.response(call, model)

    def _reuse(self, call: RecordedCall) -> None:
        """Counted as the run's, and its usage reported again (see the module's docstring)."""
        self.recorder.reused_call(call.call_id, call.kind)
        if not call.grant_id:
            return
        scope = self.inner.scope
        self.inner.report(
            RecordUsage(
                request_id=f"{call.grant_id}-usage", tree=scope.tree, run=scope.run,
                prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens,
                cost=call.cost, model=call.model, role=call.role,
            )
        )  # fmt: skip

    def stream(self, request: Request) -> Any:
        return self.inner.stream(request)

    def close(self) -> None:
        self.inner.close()


class AsyncJournalEngine:
    def __init__(self, sync: JournalEngine) -> None:
        self.sync = sync

    async def complete(self, request: Request) -> Response:
        return await asyncio.to_thread(self.sync.complete, request)

    def stream(self, request: Request) -> Any:
        return self.sync.stream(request)

    async def aclose(self) -> None:
        pass


def journal_lm(lm: Any, resume: Resume, recorder: RunRecorder) -> Any:
    """`lm` (a `budgeted_lm`) with its engine answering from the run's record first."""
    engine = JournalEngine(lm.engine, resume, recorder)
    return dspy.LM(
        lm.model, engine=engine, async_engine=AsyncJournalEngine(engine), cache=False,
        num_retries=0,
    )  # fmt: skip
