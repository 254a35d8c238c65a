"""The agent service.

Owns: the chat agent (dspy.ReAct), the recursive engine (dspy.RLM), the `RemoteInterpreter`
that runs RLM code through the sandbox broker, the host side of `llm_query` / `sub_rlm`.
Consumes: `fleet.work.agent.*` (turns, child runs). Emits: run and session events.
Talks to: the budget service (grants) and the sandbox broker (`fleet.rpc.sandbox-broker.*`).
"""
