"""The decider kernel: fold a subject, decide, append with `expect`, re-decide on a lost race.

Every writer of the mesh that decides from what a subject already holds (the budget's ledgers,
a session's log, a sandbox's log) goes through one `Decider` per kind of subject:

    ledger = Ledger(
        name="tree",                           # snapshot key; bump `version` with `evolve`
        initial=TreeState,                     # the fold of an empty subject
        evolve=lambda state, stored: ...,      # fold one StoredEvent; may mutate, returns state
        clone=copy_tree,                       # scratch copy for group commits (deep enough)
        types=None,                            # Fleet-Types folded; others skipped undecoded
        state_type=TreeState,                  # only for snapshots (msgpack-decodable)
    )
    trees = Decider(store, ledger, stale=(UnknownTree,), capacity=1024, attempts=16,
                    deadline_s=5.0, max_batch=256, snapshot_after=None)

    decision = await trees.submit(
        subject,
        decide=lambda state: domain.decide(state, command),   # pure; returns a `Decided`
        wrap=lambda state, event: Envelope(id=command.request_id, ..., data=event),
        request_id=command.request_id,         # named in `Contended` / `IdUsedElsewhere`
    )
    decision, placed = await trees.place(subject, Request(request_id, decide, wrap))
                                              # the same, and where its events were stored
    cached = await trees.current(subject, fresh=True)         # .state, .head (live: read now)
    trees.forget(subject)                                     # next use folds it again

`decide(state)` returns any object with `events: Sequence[Event]` (the events to store; none
when the answer is already on the log); `submit` returns that same object once its events are
stored; `fresh=True` reads the tail first (a decision that stores nothing is checked by no
append, so one that depends on the latest events needs it). A ledger with `replay=False`
starts a subject at its head, unread (writers of facts that commute with everyone else's).
The guarantees, each one a test of tests/unit/mesh/test_decider_plan.py or
tests/integration/mesh/test_decider.py:

- *One winner*: appends carry `expect=<the head the decision was folded at>`; of two deciders
  racing on one subject only one append lands; the other folds the tail it missed and decides
  again on it (bounded by `attempts` and `deadline_s`, jittered backoff; then `Contended`,
  nothing stored by that try).
- *Idempotent requests*: an envelope id (the request id) stored before a lost ack is found by
  the store's read-back and the request is decided again on the fold, which answers from its
  index (the fold's job: remember request ids). An id already on another subject fails only
  its own request, `IdUsedElsewhere`.
- *Group commit*: requests arriving while an append is in flight are decided in order, each on
  the state after the ones before (a scratch `clone`), and stored as one atomic batch (at
  most `max_batch` requests a commit); an exception from `decide` answers only its request.
- *Stale*: a `decide` raising one of `stale` ("the state may be behind", e.g. an unknown tree
  opened through another replica) makes the driver read the tail first; only a caught-up
  state's answer stands.
- *Cache*: an LRU of `capacity` folds (cachetools); an evicted or forgotten subject is folded
  again from the store; a tail that does not chain on the cached head (a purged subject) is
  folded from the start.
- *Snapshots*: with `snapshot_after=N` (and `state_type`), a load that folded more than N
  events saves a snapshot, and the next load starts from it (same name and version only).

`plan` (pure, no I/O) is the group commit's deciding; `kernel` the driver that reads and writes.
"""

from fleet_mesh.decider.errors import Contended, DeciderError, IdUsedElsewhere
from fleet_mesh.decider.kernel import MAX_BATCH, Cached, Decider
from fleet_mesh.decider.plan import Decided, Decision, Ledger, Plan, Request, plan, provisional

__all__ = [
    "MAX_BATCH",
    "Cached",
    "Contended",
    "Decided",
    "Decider",
    "DeciderError",
    "Decision",
    "IdUsedElsewhere",
    "Ledger",
    "Plan",
    "Request",
    "plan",
    "provisional",
]
