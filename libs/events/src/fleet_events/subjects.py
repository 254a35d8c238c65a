"""Subject spaces, built and parsed in one place. Events, work items, RPC and live deltas never
overlap.

- `fleet.session.…`, `fleet.sandbox.…`, `fleet.budget.…`, `fleet.quality.…`: persisted events
- `fleet.work.<service>.<kind>`: the work queue
- `fleet.rpc.<service>.<verb>`: request/reply (core NATS; `fleet_events.bus` names every verb)
- `fleet.callback.<interpreter>`: tool callbacks relayed to one interpreter (core NATS)
- `fleet.live.<tenant>.<session>`: unpersisted deltas

Every shape is a `Pattern`: it builds a subject from checked ids, builds a filter with `*` for
the tokens left out, and parses a subject back into its named tokens (None when the subject has
another shape). Code outside `fleet_events` neither spells a subject nor splits one on "."
(`tests/unit/repo/test_subject_literals.py` fails naming the line that does).
"""

import re
from dataclasses import dataclass

from fleet_events.ids import ID_PATTERN, check_id

SERVICES = ("gateway", "agent", "sandbox-broker", "budget", "quality")
ROLES = ("checkpointer",)
"""Processes that serve verbs but are no service (no ping, no readiness probe): the
checkpointer holds the checkpoint key no service holds (docs/audit.md)."""

_PARAM = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class Pattern:
    """One subject shape, `fleet.session.{tenant}.{session}.log`: literal tokens and named
    parameters, each parameter exactly one token that is a valid id."""

    text: str

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.text.split("."))

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.text))

    def build(self, **ids: str) -> str:
        """The subject with every parameter given; each id is checked (`InvalidId`)."""
        missing = [name for name in self.params if name not in ids]
        extra = sorted(set(ids) - set(self.params))
        if missing or extra:
            raise TypeError(f"{self.text} takes {', '.join(self.params)}; got {', '.join(ids)}")
        return self._fill(ids)

    def filter(self, **ids: str) -> str:
        """A filter for every subject of this shape matching the ids given (`*` elsewhere)."""
        extra = sorted(set(ids) - set(self.params))
        if extra:
            raise TypeError(f"{self.text} has no parameter {', '.join(extra)}")
        return self._fill(ids)

    def _fill(self, ids: dict[str, str]) -> str:
        out = []
        for token in self.tokens:
            name = _param(token)
            if name is None:
                out.append(token)
            else:
                out.append(check_id(name, ids[name]) if name in ids else "*")
        return ".".join(out)

    def parse(self, subject: str) -> dict[str, str] | None:
        """The parameters of `subject` by name, or None when it is not of this shape."""
        parts = subject.split(".")
        tokens = self.tokens
        if len(parts) != len(tokens):
            return None
        found: dict[str, str] = {}
        for token, part in zip(tokens, parts, strict=True):
            name = _param(token)
            if name is None:
                if part != token:
                    return None
            elif ID_PATTERN.fullmatch(part) is None:
                return None
            else:
                found[name] = part
        return found


def _param(token: str) -> str | None:
    match = _PARAM.fullmatch(token)
    return match.group(1) if match else None


SESSION_LOG = Pattern("fleet.session.{tenant}.{session}.log")
SESSION_RUN = Pattern("fleet.session.{tenant}.{session}.run.{run}")
SANDBOX = Pattern("fleet.sandbox.{tenant}.{sandbox}")
BUDGET_TREE = Pattern("fleet.budget.{tree}")
BUDGET_TENANT_DAY = Pattern("fleet.budget.tenant.{tenant}.{day}")
QUALITY = Pattern("fleet.quality.{kind}.{id}")
WORK = Pattern("fleet.work.{service}.{kind}")
RPC = Pattern("fleet.rpc.{service}.{verb}")
SANDBOX_RPC = Pattern("fleet.rpc.{service}.sandbox.{sandbox}.{verb}")
CALLBACK = Pattern("fleet.callback.{interpreter}")
CELL_OUTPUT = Pattern("fleet.callback.{interpreter}.output")
LIVE = Pattern("fleet.live.{tenant}.{session}")

SESSIONS_ALL = "fleet.session.>"
"""Every session subject of every tenant (the SESSIONS stream's subjects)."""
SESSION_LOGS = SESSION_LOG.filter()
"""Every session's `.log` (the dispatcher's and the trace exporter's consumers)."""


def session_scope(tenant: str, session: str) -> str:
    """Every subject of one session (its log and all its runs)."""
    return f"{SESSION_LOG.filter(tenant=tenant, session=session).removesuffix('.log')}.>"


def tenant_scope(tenant: str) -> str:
    """Every session subject of one tenant."""
    return f"fleet.session.{check_id('tenant', tenant)}.>"


def stream_scope(space: str) -> str:
    """Everything under one event space (`session`, `sandbox`, `budget`, `quality`, `work`)."""
    if space not in ("session", "sandbox", "budget", "quality", "work"):
        raise ValueError(f"unknown subject space {space!r}")
    return f"fleet.{space}.>"


@dataclass(frozen=True, slots=True)
class SessionSubject:
    """Where a session event sits: its tenant, its session, and its run (None: the `.log`)."""

    tenant: str
    session: str
    run: str | None = None

    @property
    def is_log(self) -> bool:
        return self.run is None

    @property
    def scope(self) -> str:
        """The filter for every subject of this event's session."""
        return session_scope(self.tenant, self.session)


def parse_session(subject: str) -> SessionSubject | None:
    """A session subject of either shape (`….log`, `….run.<run>`), else None."""
    found = SESSION_LOG.parse(subject)
    if found is not None:
        return SessionSubject(found["tenant"], found["session"])
    found = SESSION_RUN.parse(subject)
    if found is not None:
        return SessionSubject(found["tenant"], found["session"], found["run"])
    return None


def space_of(subject: str) -> str | None:
    """The subject space (`session`, `sandbox`, `rpc`, …) of a `fleet.` subject, else None."""
    head, _, rest = subject.partition(".")
    if head != "fleet" or not rest:
        return None
    return rest.partition(".")[0]


def tenant_token(subject: str) -> str | None:
    """The tenant token of a tenant-scoped event subject (sessions, sandboxes), whatever its
    length after it, else None: a blob is read for this tenant only."""
    parts = subject.split(".", 3)
    if len(parts) == 4 and parts[0] == "fleet" and parts[1] in ("session", "sandbox"):
        return parts[2]
    return None


def is_wildcard(subject: str) -> bool:
    """Whether `subject` is a filter (a `*` or `>` token) rather than one subject."""
    return any(token in ("*", ">") for token in subject.split("."))


def matches(filter_subject: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    want, have = filter_subject.split("."), subject.split(".")
    for index, part in enumerate(want):
        if part == ">":
            return len(have) > index
        if index >= len(have) or (part != "*" and part != have[index]):
            return False
    return len(want) == len(have)


def _service(service: str) -> str:
    if service not in SERVICES and service not in ROLES:
        raise ValueError(
            f"unknown service {service!r}: expected one of {', '.join(SERVICES + ROLES)}"
        )
    return service


def rpc(service: str, verb: str) -> str:
    return RPC.build(service=_service(service), verb=verb)


def work(service: str, kind: str) -> str:
    return WORK.build(service=_service(service), kind=kind)


def callback(interpreter: str) -> str:
    return CALLBACK.build(interpreter=interpreter)


def live(tenant: str, session: str) -> str:
    return LIVE.build(tenant=tenant, session=session)
