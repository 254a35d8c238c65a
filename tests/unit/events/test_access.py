"""The access table and the NATS permissions derived from it (issue 24, item 2): pure, so
every rule is checked here without a server; tests/integration/mesh/test_permissions.py
shows the server enforcing them."""

import json

import pytest

from fleet_events import bus, streams, subjects
from fleet_events.access import (
    ACCESS,
    ADMIN,
    EVERYTHING,
    ROLES,
    access_of,
    callers_of,
    inbox_prefix,
    permissions,
)

SERVING = [r for r in ROLES if r != ADMIN]


def test_every_process_kind_has_a_table_and_only_the_admin_may_do_everything() -> None:
    assert set(ACCESS) == set(SERVING)
    assert set(SERVING) == {*subjects.SERVICES, "checkpointer"}
    assert permissions(ADMIN) == EVERYTHING
    for role in SERVING:
        p = permissions(role)
        assert ">" not in p.publish
        assert ">" not in p.subscribe
        assert not [s for s in p.publish if s.startswith("fleet.") and s.endswith(".>")], role


@pytest.mark.parametrize("role", SERVING)
def test_a_role_subscribes_to_its_own_inbox_and_verbs_and_to_no_other_roles(role: str) -> None:
    p = permissions(role)
    assert f"{inbox_prefix(role)}.>" in p.subscribe
    others = [r for r in ROLES if r != role]
    assert not [s for s in p.subscribe for r in others if s.startswith(inbox_prefix(r) + ".")]
    served = {v for v in bus.VERBS if v.service == role}
    for verb in bus.VERBS:
        pattern = _filter(verb)
        if verb in served:
            assert pattern in p.subscribe, (role, verb.key)
        else:
            assert not any(_covers(s, pattern) for s in p.subscribe), (role, verb.key)


def test_every_verb_has_a_caller_and_its_server_may_answer_each_caller() -> None:
    for verb in bus.VERBS:
        callers = [r for r in SERVING if verb in access_of(r).calls]
        assert callers or verb.service == "quality", f"nobody calls {verb.key}"
        server = permissions(verb.service) if verb.service in ACCESS else None
        for caller in callers:
            assert _filter(verb) in permissions(caller).publish, (caller, verb.key)
            assert server is not None
            assert f"{inbox_prefix(caller)}.>" in server.publish, (verb.service, caller)
        assert callers_of(verb)[-1] == ADMIN


def test_a_role_may_not_answer_to_the_inbox_of_a_role_that_never_calls_it() -> None:
    # the budget serves only the agent (and every service's ping, asked by the gateway)
    budget = permissions("budget")
    assert f"{inbox_prefix('sandbox-broker')}.>" not in budget.publish
    assert f"{inbox_prefix('agent')}.>" in budget.publish


def test_every_event_channel_has_a_writer_and_only_its_owners_append_to_it() -> None:
    writers = {c.name: [r for r in SERVING if c in access_of(r).appends] for c in bus.CHANNELS}
    assert writers["budget-tree"] == ["budget"]
    assert writers["sandbox"] == ["sandbox-broker"]
    assert writers["session-run"] == ["agent"]
    assert writers["agent-turn"] == ["agent"]
    assert sorted(writers["session-log"]) == ["agent", "checkpointer", "gateway"]
    assert [name for name, who in writers.items() if not who] == ["work"]  # the generic shape
    for role in SERVING:
        p = permissions(role)
        for channel in bus.CHANNELS:
            pattern = subjects.Pattern(channel.pattern).filter()
            assert (pattern in p.publish) == (channel in access_of(role).appends), (role, pattern)


def test_a_durable_consumer_is_pulled_only_by_the_role_that_owns_it() -> None:
    for spec in streams.CONSUMERS:
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        for role in SERVING:
            p = permissions(role)
            owns = spec in access_of(role).pulls
            reachable = (
                any(_covers(s, subject) for s in p.publish) and subject not in p.publish_deny
            )
            assert reachable == owns, (role, spec.durable)


def test_a_stream_is_read_only_by_the_roles_whose_table_names_it() -> None:
    for stream in streams.STREAMS:
        subject = f"$JS.API.DIRECT.GET.{stream.name}"
        readers = {r for r in SERVING if subject in permissions(r).publish}
        assert readers == {r for r in SERVING if stream in access_of(r).reads}, stream.name
    # the budget ledger is the budget's; the gateway sees its size (readiness), never its events
    gateway = permissions("gateway")
    assert "$JS.API.STREAM.INFO.BUDGET" in gateway.publish
    assert not [s for s in gateway.publish if ".BUDGET" in s and "INFO" not in s]


def test_buckets_are_written_only_by_their_writers() -> None:
    secrets = "$KV.fleet-secrets.>"
    assert [r for r in SERVING if secrets in permissions(r).publish] == ["gateway"]
    tickets = "$KV.fleet-tickets.>"
    assert [r for r in SERVING if tickets in permissions(r).publish] == ["gateway"]
    assert "$JS.API.DIRECT.GET.KV_fleet-secrets.>" not in permissions("budget").publish


def test_only_the_checkpointer_purges_the_session_log() -> None:
    purge = "$JS.API.STREAM.PURGE.SESSIONS"
    assert [r for r in SERVING if purge in permissions(r).publish] == ["checkpointer"]


def test_the_server_configuration_carries_the_denies_only_where_there_are_some() -> None:
    gateway = permissions("gateway").config()
    assert json.loads(json.dumps(gateway)) == gateway
    assert set(gateway) == {"publish", "subscribe"}
    dispatch = "$JS.API.CONSUMER.MSG.NEXT.SESSIONS.agent-turn-dispatch"
    assert dispatch in gateway["publish"]["deny"]
    assert "deny" not in permissions("agent").config()["publish"]  # it owns every durable


def test_an_unknown_role_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown role 'rogue'"):
        permissions("rogue")
    with pytest.raises(ValueError, match="unknown role"):
        inbox_prefix("rogue")


def _filter(verb: bus.Verb[object, object]) -> str:
    if verb.scope == "service":
        return verb.subject()
    if verb.scope == "sandbox":
        return subjects.SANDBOX_RPC.filter(service=verb.service, verb=verb.name)
    return subjects.CALLBACK.filter()


def _covers(allowed: str, subject: str) -> bool:
    """Whether the NATS filter `allowed` covers `subject` (itself a filter: `*` as a token)."""
    return subjects.matches(allowed, subject)


def test_the_server_block_lists_exactly_the_derived_subjects_under_allow() -> None:
    for role in SERVING:
        p = permissions(role)
        block = p.config()
        assert block["publish"]["allow"] == list(p.publish)
        assert block["subscribe"]["allow"] == list(p.subscribe)
        assert "$JS.API.INFO" in p.publish  # every JetStream client asks its account first


def test_bucket_and_object_store_reads_name_their_streams() -> None:
    agent = permissions("agent").publish
    assert "$JS.API.DIRECT.GET.KV_fleet-config.>" in agent  # runtime settings, LLM profiles
    assert "$JS.API.STREAM.INFO.OBJ_fleet-blobs" in agent
    assert "$O.fleet-blobs.>" in agent
    assert "$KV.fleet-config.>" not in agent  # it reads the settings, never writes them


def test_the_admin_and_an_unknown_role_are_refused_an_access_table_by_name() -> None:
    with pytest.raises(ValueError, match="'admin' may do everything: it has no access table"):
        access_of(ADMIN)
    with pytest.raises(ValueError, match="expected one of gateway, agent, sandbox-broker"):
        access_of("rogue")
