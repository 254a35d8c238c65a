"""The clarification tool: ask the user and wait for the answer, or park the turn on it."""

from fleet_agent.chat.session_log import wait_for_answer
from fleet_agent.chat.tools.kit import ParkTurn, ToolError, ToolKit
from fleet_events import new_id
from fleet_events.session import InputExpired, InputRequested


class Clarify:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def ask_user(self, question: str, options: list[str] | None = None) -> str:
        """Ask the user a question and wait for the answer (free text, or one of `options`).
        Use only when the message cannot be answered without them."""
        kit = self.kit
        chosen = tuple(str(o)[:200] for o in (options or ())[:10])
        asked = kit.log(
            InputRequested(
                request_id=new_id(),
                question=question[:2000],
                options=chosen,
                timeout_s=kit.clarify_timeout_s,
            )
        )  # asked again after its holder died: the question stored before stands
        request_id, seq = asked.event.request_id, asked.seq
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


__all__ = ["Clarify"]
