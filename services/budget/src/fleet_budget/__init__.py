"""The budget service: the LLM-call ledger of each recursive tree (docs/budget.md).

Owns: `fleet.budget.<tree>` (one ledger per tree: opened, granted, refused, usage, children,
closed) and `fleet.budget.tenant.<tenant>.<day>` (daily ledgers of tenants with caps).
Consumes: requests on `fleet.rpc.budget.{open,grant,usage,admit,status,close}` in the
`budget` queue group. Emits: the events of `fleet_events.budget` on the BUDGET stream.
"""
