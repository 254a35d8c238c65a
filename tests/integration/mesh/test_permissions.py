"""Per-role NATS users (issue 24, item 2): what a role's access table does not say, the server
refuses, and the refusal is named. Every server of the suite runs with these users
(conftest.py); here each role's own seed is used against one."""

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from fleet_events import bus, subjects
from fleet_events.access import ADMIN, ROLES, access_of, inbox_prefix
from fleet_harness.procs import base_env
from fleet_harness.waits import eventually
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import PermissionRefused, connect, refusals, require_permitted
from fleet_mesh.credentials import CREDENTIALS_ENV, Credentials
from fleet_mesh.natsserver import NatsServer

SERVING = [r for r in ROLES if r != ADMIN]
AsRole = Callable[[str], Awaitable[Client]]


def _credentials(server: NatsServer) -> Credentials:
    assert server.credentials is not None, "the suite's servers run with credentials"
    return server.credentials


@pytest.fixture
async def as_role(nats_server: NatsServer) -> AsyncIterator[AsRole]:
    made: list[Client] = []

    async def open_as(role: str) -> Client:
        nc = await connect(
            nats_server.url,
            name=f"test-{role}",
            credentials=_credentials(nats_server).seed_path(role),
        )
        made.append(nc)
        return nc

    yield open_as
    for nc in made:
        await nc.close()


def published(subject: str) -> str:
    """How the refusal of a publish reads (nats-py lowercases the server's error text)."""
    return f'permissions violation for publish to "{subject.lower()}"'


async def _noop(_: Msg) -> None:
    return None


def _foreign_verb(role: str) -> bus.Verb[object, object]:
    """A verb another role serves and `role` does not call."""
    access = access_of(role)
    return next(
        v for v in bus.VERBS if v.service != role and v not in access.calls and v.scope == "service"
    )


@pytest.mark.parametrize("role", SERVING)
async def test_subscribing_to_another_roles_verb_is_refused_and_named(
    as_role: AsRole, role: str
) -> None:
    nc = await as_role(role)
    other = next(v for v in bus.VERBS if v.service not in (role,) and v.scope == "service")
    await nc.subscribe(other.subject(), cb=_noop)
    with pytest.raises(PermissionRefused, match=f'subscription to "{other.subject()}"'):
        await require_permitted(nc, role)


@pytest.mark.parametrize("role", SERVING)
async def test_calling_a_verb_outside_the_table_is_refused_and_never_reaches_its_server(
    as_role: AsRole, role: str
) -> None:
    verb = _foreign_verb(role)
    server = await as_role(ADMIN)
    heard: list[Msg] = []

    async def hear(msg: Msg) -> None:
        heard.append(msg)

    await server.subscribe(verb.subject(), cb=hear)
    await server.flush()
    nc = await as_role(role)
    await nc.publish(verb.subject(), b"{}")
    await nc.flush()
    await eventually(lambda: refusals(nc) or None, timeout=5, what="the refusal")
    assert refusals(nc) == [published(verb.subject())]
    # the admin, on the same server, does reach it: the refusal is the role's, not the subject's
    admin = await as_role(ADMIN)
    await admin.publish(verb.subject(), b"{}")
    await eventually(lambda: len(heard) == 1 or None, timeout=5, what="the admin's call")
    assert len(heard) == 1


@pytest.mark.parametrize("role", SERVING)
async def test_another_roles_replies_cannot_be_read(as_role: AsRole, role: str) -> None:
    other = next(r for r in SERVING if r != role)
    nc = await as_role(role)
    await nc.subscribe(f"{inbox_prefix(other)}.>", cb=_noop)
    with pytest.raises(PermissionRefused, match=f"{inbox_prefix(other)}"):
        await require_permitted(nc, role)


async def test_a_role_can_call_what_its_table_says_and_the_reply_comes_to_its_own_inbox(
    as_role: AsRole,
) -> None:
    budget = await as_role("budget")
    agent = await as_role("agent")
    inboxes: list[str] = []

    async def answer(msg: Msg) -> None:
        inboxes.append(msg.reply)
        await msg.respond(b"granted")

    verb = bus.TREE_STATUS  # any budget verb; this test answers it itself, as budget
    sub = await budget.subscribe(verb.subject(), queue="test-" + uuid.uuid4().hex, cb=answer)
    await require_permitted(budget, "budget")
    reply = await agent.request(verb.subject(), b"{}", timeout=5)
    await sub.unsubscribe()
    assert reply.data == b"granted"
    assert inboxes[0].startswith(inbox_prefix("agent") + ".")
    assert refusals(agent) == []
    assert refusals(budget) == []


async def test_appending_to_another_roles_stream_is_refused_and_nothing_is_stored(
    as_role: AsRole, nats_server: NatsServer
) -> None:
    admin = await as_role(ADMIN)
    await bootstrap(admin.jetstream())
    gateway = await as_role("gateway")
    subject = subjects.BUDGET_TREE.build(tree="t" + uuid.uuid4().hex[:12])
    with pytest.raises(nats.errors.TimeoutError):
        await gateway.jetstream().publish(subject, b"{}", timeout=1)
    assert refusals(gateway) == [published(subject)]
    with pytest.raises(nats.js.errors.NotFoundError):
        await admin.jetstream().get_last_msg("BUDGET", subject)


async def test_pulling_another_roles_work_queue_is_refused(
    as_role: AsRole,
) -> None:
    admin = await as_role(ADMIN)
    await bootstrap(admin.jetstream())
    gateway = await as_role("gateway")
    subject = "$JS.API.CONSUMER.MSG.NEXT.WORK.agent-turn"
    await gateway.publish(subject, b'{"batch": 1}', reply=f"{inbox_prefix('gateway')}.x")
    await eventually(lambda: refusals(gateway) or None, timeout=5, what="the refusal")
    assert refusals(gateway) == [published(subject)]
    # and the session log's dispatcher consumer, on a stream the gateway may read, is the
    # agent's alone
    dispatch = "$JS.API.CONSUMER.MSG.NEXT.SESSIONS.agent-turn-dispatch"
    await gateway.publish(dispatch, b'{"batch": 1}', reply=f"{inbox_prefix('gateway')}.y")
    await eventually(lambda: len(refusals(gateway)) == 2 or None, timeout=5, what="refusal")
    assert refusals(gateway)[1] == published(dispatch)


async def test_a_client_without_credentials_is_refused_at_once(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the server's own words, on the wire: a CONNECT naming no user is refused
    reader, writer = await asyncio.open_connection("127.0.0.1", nats_server.port)
    try:
        info = json.loads((await reader.readline()).decode().removeprefix("INFO "))
        assert info["auth_required"] is True
        assert info["nonce"]  # an NKey user signs it
        writer.write(b'CONNECT {"verbose":false,"protocol":1}\r\nPING\r\n')
        await writer.drain()
        assert (await reader.readline()).strip() == b"-ERR 'Authorization Violation'"
    finally:
        writer.close()
        await writer.wait_closed()
    # fleet's own connect ends too (nats-py alone would retry a refused user for ever)
    monkeypatch.delenv(CREDENTIALS_ENV)
    with pytest.raises(PermissionRefused, match="it requires credentials"):
        await asyncio.wait_for(connect(nats_server.url, name="nobody"), 20)


async def test_a_service_started_with_another_roles_credentials_exits_naming_the_refused_subject(
    nats_server: NatsServer, as_role: AsRole
) -> None:
    await bootstrap((await as_role(ADMIN)).jetstream())  # its buckets exist: it gets that far
    env = base_env(nats_server.url, "budget-0", "budget")
    env[CREDENTIALS_ENV] = str(_credentials(nats_server).seed_path("quality"))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "fleet_budget"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f'subscription to "{bus.OPEN_TREE.subject()}"' in output
    assert "these credentials are not this process's" in output
    seed = (_credentials(nats_server).seed_path("quality")).read_text().strip()
    assert seed not in output
