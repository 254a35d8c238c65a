"""What `fleet up` and `fleet status` print of `/ready`: a component on its way up (the embedded
model installing) is shown as starting, with a line of its own saying how long it still needs
and that the mesh serves meanwhile; nothing else gets such a line."""

from rich.console import Console

from fleet_cli import display
from fleet_cli.status import ReadyAnswer

BUILDING = "building: qwen2.5-coder-0.5b-instruct at http://127.0.0.1:8181/v1, ~11 min left"


def answer(*components: dict[str, str]) -> ReadyAnswer:
    return ReadyAnswer(url="http://127.0.0.1:8080", status_code=200, body={
        "ready": True, "components": list(components),
    })  # fmt: skip


def test_a_component_on_its_way_up_gets_a_line_saying_how_long_and_others_none() -> None:
    shown = answer(
        {"name": "nats", "kind": "nats", "state": "up", "detail": "nats://127.0.0.1:4222"},
        {"name": "daytona", "kind": "provider", "state": "degraded", "detail": "circuit open"},
        {"name": "llm", "kind": "llm", "state": "starting", "detail": BUILDING},
    )
    assert display.starting(shown) == [
        f"llm: {BUILDING}; the mesh serves meanwhile and model calls wait for it"
    ]
    assert display.starting(answer({"name": "llm", "kind": "llm", "state": "up"})) == []


def test_the_table_shows_a_starting_component_as_starting_not_as_down() -> None:
    console = Console(width=200, record=True, color_system="truecolor")
    console.print(display.components(answer({"name": "llm", "kind": "llm", "state": "starting"})))
    text = console.export_text(clear=False)
    assert "starting" in text
    assert "down" not in text
    styled = console.export_html(inline_styles=True)
    assert "color: #808000" in styled  # yellow, as a degraded component, not red
