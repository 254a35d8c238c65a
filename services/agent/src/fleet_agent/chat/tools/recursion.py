"""The recursion and long-context tools: each a child run of the chat run (the engine's RLM),
on the session's sandbox, in the turn's tree (`run.child_run_requested` / `_completed` /
`_failed` on the chat run's record)."""

import concurrent.futures
from typing import Any

from fleet_agent.chat import documents as docs
from fleet_agent.chat.signatures import LONG_CONTEXT, RLM_TURN
from fleet_agent.chat.tools.documents import Documents
from fleet_agent.chat.tools.kit import BATCH_LIMIT, RESULT_CHARS, ToolError, ToolKit
from fleet_agent.engine.model import RlmResult, RlmTask, RunContext, child_run_id
from fleet_events.run import ChildRunCompleted, ChildRunFailed, ChildRunRequested


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


__all__ = ["Recursion", "child_run"]
