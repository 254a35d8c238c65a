"""The sandbox broker: owns every sandbox and its REPL contexts.

Owns: the providers (`local` here), per-sandbox processes, REPL contexts, fork, files in
workspaces, and the child isolation policy.
Consumes: `fleet.rpc.sandbox-broker.*` requests (create/list in a queue group; per-sandbox verbs
on `fleet.rpc.sandbox-broker.sandbox.<id>.*`, answered by the replica holding it).
Emits: lifecycle events on `fleet.sandbox.<tenant>.<sandbox>` (SANDBOXES stream) and tool
callbacks to `fleet.callback.<interpreter>`.
"""
