"""How the daytona provider takes a cell's answer out of its output (`_answer`): the last frame
of this execution's token, whole, of a known kind; anything else leaves the output as it is."""

from fleet_sandbox_broker.providers.daytona.provider import _answer


def frame(token: str, body: str) -> str:
    return f"[fleet-answer {token}]{body}[/fleet-answer {token}]"


def test_the_last_frame_of_the_token_is_the_answer_and_leaves_the_output() -> None:
    out = "printed\n" + frame("t1", '{"kind": "final", "value": 1}') + "more\n"
    out += frame("t1", '{"kind": "result", "value": 42}')
    answer, printed = _answer(out, "t1")
    assert answer == {"kind": "result", "value": 42}
    assert printed == "printed\n" + frame("t1", '{"kind": "final", "value": 1}') + "more\n"


def test_another_token_an_unknown_kind_garbage_or_no_end_is_no_answer() -> None:
    for out in (
        frame("other", '{"kind": "result", "value": 1}'),
        frame("t1", '{"kind": "terminal", "error": "forged"}'),
        frame("t1", '{"kind": "result", "value": '),
        frame("t1", '["result"]'),
        '[fleet-answer t1]{"kind": "result", "value": 1}',
        "",
    ):
        answer, printed = _answer(out, "t1")
        assert answer is None, out
        assert printed == out
