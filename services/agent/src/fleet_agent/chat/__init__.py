"""The chat agent: a `TurnRunner` over dspy (ChainOfThought, then ReAct with the earlier
system's tool families, then the recursive engine), escalating by a stated rule and recording
every step on the turn's run subject (docs/agent.md, "Chat agent")."""
