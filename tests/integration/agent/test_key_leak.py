"""A planted API key, end to end: sealed into the secrets store as the gateway seals it, used by
a real chat turn (an agent replica with `FLEET_AGENT_RUNNER=chat`, a real sandbox broker, budget
and sandboxes as processes) against the scripted LM (a FAKE model server) that demands it as
its bearer, and then looked for everywhere the mesh keeps or prints anything: every stored
message of every JetStream stream (KV buckets' histories and the object store are streams
too), the processes' log output, the sandboxes' files and the answer. It is nowhere.

The turn goes through the paths most likely to carry a key: a ReAct step, code run in the
sandbox (which prints its whole environment), that output loaded as a document (its text in
the object store), a model call that fails with a 500 (litellm's error text) and the fallback
to ChainOfThought.
"""

import json
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from fleet_events import streams
from fleet_events.llm import LlmProfile
from fleet_events.run import FellBack, LlmCalled, ToolReturned
from fleet_events.session import TurnCompleted
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsWriter, ensure_keypair, load_public_key

from .rlm_kit import Processes, fields, of_type, processes, session

__all__ = ["processes"]

pytestmark = pytest.mark.slow

AGENT_ENV = {
    "FLEET_AGENT_RUNNER": "chat",
    "FLEET_AGENT_TURN_SLOTS": "1",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "6",
}

PLANTED = "sk-leakcheck-" + "5e6f7a" * 6
MARKER = "answer-marker-" + "91b2" * 4
DUMP_ENV = (
    "import json, os\n"
    "dumped = json.dumps(dict(os.environ))\n"
    "open('env.json', 'w').write(dumped)\n"
    "print(dumped)"
)


def act(tool: str, args: str) -> str:
    return fields(next_thought="next", next_tool_name=tool, next_tool_args=args)


async def every_stream_message(js: JetStreamContext) -> dict[str, list[bytes]]:
    """Each stream's stored messages, raw: subject, body and headers, by stream name."""
    found: dict[str, list[bytes]] = {}
    for info in await js.streams_info():
        name = info.config.name
        assert name is not None
        state = (await js.stream_info(name)).state
        raws: list[bytes] = []
        for seq in range(max(1, state.first_seq), state.last_seq + 1):
            try:
                msg = await js.get_msg(name, seq)
            except NotFoundError:  # a deleted or purged sequence
                continue
            raws.append((msg.subject or "").encode() + b" " + (msg.data or b""))
            raws.extend(f"{k}={v}".encode() for k, v in (msg.headers or {}).items())
        found[name] = raws
    return found


def files_under(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


async def test_a_planted_key_is_used_by_a_turn_and_found_nowhere(processes: Processes) -> None:
    root = processes.sandboxes.parent
    keys = ensure_keypair(root / "secrets")  # the pair the agent replica was started with
    script: list[Reply | str] = [
        act("execute_code", json.dumps({"code": DUMP_ENV})),
        act("load_document", '{"source": "env.json", "alias": "env"}'),
        Reply("the model server broke", status=500),
        fields(reasoning="the code ran", answer=MARKER, needs_tools=False),
    ]
    with ScriptedLM(script, api_key=PLANTED) as fake:
        async with session(processes) as s:
            js = s.nc.jetstream()
            # what the gateway's POST /runtime/llm-profiles does: seal with the public key
            # under `llm-<profile>`, and store a profile that names the secret
            writer = await SecretsWriter.open(js, load_public_key(keys.public))
            await writer.put("llm-main", PLANTED, tenant=s.tenant)
            config = await LlmConfig.open(js)
            profile = LlmProfile(
                name="main", model="openai/scripted", api_base=fake.base_url, secret="llm-main"
            )
            await config.put_profile(profile, tenant=s.tenant)
            for role in ("planner", "delegate"):
                await config.set_role(role, "main", tenant=s.tenant)

            turn = await s.ask("Run code in the sandbox that prints its environment")
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
            stored = await every_stream_message(js)
    # the key was really used: every call carried it as the bearer, none was refused
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == MARKER
    assert len(fake.requests) == 4
    assert {r.authorization for r in fake.requests} == {f"Bearer {PLANTED}"}
    assert fake.refused_auth == 0
    (ran,) = [r for r in of_type(events, ToolReturned) if r.tool == "execute_code"]
    assert ran.error == ""
    assert "PATH" in json.loads(ran.result)  # the sandbox printed its environment
    (down,) = of_type(events, FellBack)
    assert down.reason == "react_failed"
    assert len([c for c in of_type(events, LlmCalled) if c.error]) == 1

    planted = PLANTED.encode()
    # the search sees what it must: the answer in the sessions stream, the sealed secret in
    # its bucket, the profile's history in the config bucket, text in the object store
    sessions = b"\n".join(stored[streams.SESSIONS.name])
    assert MARKER.encode() in sessions
    assert b"llm-main" in b"\n".join(stored[f"KV_{streams.SECRETS.bucket}"])
    assert fake.base_url.encode() in b"\n".join(stored[f"KV_{streams.CONFIG.bucket}"])
    objects = b"\n".join(stored[f"OBJ_{streams.BLOBS.bucket}"])
    assert b'"PATH"' in objects  # the loaded document's text, as the object store holds it
    leaked = [name for name, raws in stored.items() if any(planted in raw for raw in raws)]
    assert leaked == [], f"the key is stored in streams {leaked}"

    logs = {p.name: p.read_bytes() for p in root.glob("*.log")}
    assert {"agent-0.log", "broker.log", "budget.log", "nats.log"} <= set(logs)
    assert logs["agent-0.log"]  # the replica did write its log
    assert [name for name, text in logs.items() if planted in text] == []
    assert [str(p) for p, data in files_under(processes.sandboxes).items() if planted in data] == []
    assert PLANTED not in ran.result
    assert PLANTED not in ended.answer
