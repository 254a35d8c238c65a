"""`fleet replay` (issue 13, part 3): sessions recorded by a real mesh (broker, budget and an
agent replica as processes, the scripted LM a FAKE model server) are exported from the store
and replayed offline in a fresh local sandbox (the replay's own nats-server and broker): no
model is called.

- a recursive session (a root with `llm_query` and two `sub_rlm_batched` children) reproduces,
  children included, through the CLI command as well;
- the same export with one recorded cell output altered, its chain rehashed and re-signed
  with the (stolen) service key, still verifies against the pinned keys, and the replay names
  that cell as diverged;
- a session whose cell reads the clock is reported `nondeterministic` at that cell, and still
  reproduces.
"""

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from tests.integration.agent.rlm_kit import Processes, Session, processes, session, step
from typer.testing import CliRunner, Result

from fleet_cli.main import cli
from fleet_cli.replay import Report, replay_lines
from fleet_events.chain import GENESIS, link
from fleet_events.signing import KeySet, Signer
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_mesh.store.records import verify_export

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENT_ENV = {"FLEET_ENGINE_MAX_ITERS": "6", "FLEET_ENGINE_CHILD_SLOTS": "2"}


def script(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    if "CLOCKROOT" in text:
        if "CLOCK-OUT" not in text:
            return Reply(step("import time\nt = time.time()\nprint('CLOCK-OUT', t)"), key="c1")
        return Reply(step("SUBMIT(answer='tick')"), key="c2")
    if "REPLAYROOT" in text:
        if "STEP1-OUT" not in text:
            return Reply(step("x = 41\nprint('STEP1-OUT', x)"), key="r1")
        if "STEP2-OUT" not in text:
            fan = "kids = sub_rlm_batched(['REPLAYKID alpha', 'REPLAYKID beta'])"
            return Reply(step(f"{fan}\nprint('STEP2-OUT', kids)"), key="r2")
        if "STEP3-OUT" not in text:
            return Reply(step("y = llm_query('REPLAYSUB please')\nprint('STEP3-OUT', y)"), key="r3")
        return Reply(step("SUBMIT(answer=str(x + 1) + ''.join(kids) + y)"), key="r4")
    if "REPLAYSUB" in text:
        return Reply("ok", key="sub")
    kid = "alpha" if "REPLAYKID alpha" in text else "beta"
    if "KID-OUT" not in text:
        return Reply(step(f"v = len('{kid}')\nprint('KID-OUT', v)"), key=f"{kid}1")
    return Reply(step(f"SUBMIT(answer='{kid[0].upper()}')"), key=f"{kid}2")


async def recorded(s: Session, message: str) -> list[bytes]:
    turn = await s.ask(message)
    await s.ended(turn, timeout=120)
    return [line async for line in s.store.export(f"fleet.session.{s.tenant}.{s.session}.>")]


def rows(lines: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def payload(row: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(base64.b64decode(row["payload"]))
    return loaded


def signed(all_rows: list[dict[str, Any]], signer: Signer) -> list[dict[str, Any]]:
    """The rows as a service holding `signer` appends them: re-linked per subject, signed."""
    heads: dict[str, str] = {}
    for row in all_rows:
        subject = row["subject"]
        row["prev"] = heads.get(subject, GENESIS)
        row["hash"] = link(row["prev"], base64.b64decode(row["payload"]))
        row["key"], row["sig"] = signer.key_id, signer.sign_append(subject, row["hash"])
        heads[subject] = row["hash"]
    return all_rows


def lines_of(all_rows: list[dict[str, Any]], signer: Signer) -> list[bytes]:
    keyset = KeySet.of([signer], require_signatures=True)
    return [json.dumps(keyset.to_json()).encode()] + [json.dumps(r).encode() for r in all_rows]


async def fleet(*argv: str) -> Result:
    """The CLI as a user runs it (its own event loop: in a thread, this test has one)."""

    def run() -> Result:
        return CliRunner().invoke(cli(list(argv)), list(argv))

    return await asyncio.to_thread(run)


def statuses(report: Report) -> list[tuple[int, str]]:
    return [(s.depth, s.status) for s in report.steps]


async def test_replay_reproduces_a_recursive_session_and_names_an_altered_cell(
    processes: Processes, tmp_path: Path
) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            lines = await recorded(s, "REPLAYROOT: fan out and ask")
    calls_made = sum(fake.calls.values())

    report = await replay_lines(lines)
    assert report.reproduced, report.steps
    assert report.runs == 3  # the root and both children
    depths = [d for d, _ in statuses(report)]
    assert depths.count(1) == 2 * 3  # each child: dspy's facade set-up cell and its two cells
    assert {status for _, status in statuses(report)} == {"reproduced"}
    assert sum(fake.calls.values()) == calls_made  # the replay called no model

    export = tmp_path / "session.ndjson"
    export.write_bytes(b"\n".join(lines) + b"\n")
    said = await fleet("replay", str(export))
    assert said.exit_code == 0, said.output
    assert "reproduced: 11 cells in 3 runs" in said.output

    # the attack: cell 2 of the root printed 'STEP1-OUT 41'; the log is made to say 40
    stolen = Signer.generate("agent")
    honest = signed(rows(lines), stolen)
    assert verify_export(lines_of(honest, stolen), keys=KeySet.of([stolen])).fault is None
    altered = signed(rows(lines), stolen)
    target = next(
        r for r in altered
        if payload(r)["data"].get("type") == "run.cell_executed"
        and "STEP1-OUT" in payload(r)["data"].get("stdout", "")
    )  # fmt: skip
    envelope = payload(target)
    envelope["data"]["stdout"] = envelope["data"]["stdout"].replace("41", "40")
    target["payload"] = base64.b64encode(json.dumps(envelope).encode()).decode()
    forged = lines_of(signed(altered, stolen), stolen)
    assert verify_export(forged, keys=KeySet.of([stolen])).fault is None  # the key is stolen

    caught = await replay_lines(forged)
    bad = caught.diverged
    assert bad is not None
    assert (bad.status, bad.position, bad.cell_id) == (
        "diverged",
        2,
        envelope["data"]["cell_id"],
    )
    assert "STEP1-OUT 41" in bad.detail
    assert "STEP1-OUT 40" in bad.detail
    assert statuses(caught) == [(0, "reproduced"), (0, "diverged")]  # it stops there

    (tmp_path / "forged.ndjson").write_bytes(b"\n".join(forged) + b"\n")
    said = await fleet("replay", str(tmp_path / "forged.ndjson"))
    assert said.exit_code == 1, said.output
    assert f"diverged at run {bad.run} cell 2" in said.output


async def test_a_cell_reading_the_clock_is_named_nondeterministic_not_diverged(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            lines = await recorded(s, "CLOCKROOT: what time is it")
    report = await replay_lines(lines)
    assert report.reproduced  # a legitimate difference is no divergence
    (odd,) = report.nondeterministic
    assert odd.position == 2
    assert "time.time" in odd.detail
    assert "CLOCK-OUT" in odd.detail
    assert statuses(report) == [(0, "reproduced"), (0, "nondeterministic"), (0, "reproduced")]
