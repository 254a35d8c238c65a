"""The run kernel: one run's life, the same for every runner (the chat agent and the RLM engine).

- `scope`: the turn's scope: open the turn's budget tree, build the root run's context, mirror
  the turn's cancel into it, close the tree unless the run was fenced or parked;
- `lifecycle` (pure): given the run's record and an outcome, the run's events: how an attempt
  begins (fresh, taken over, from a record that ends), the one terminal event, how the turn ends;
- `failures`: the agent's one failure family (`AgentError`: a `code`, whether asking again may
  help, the user's message) and its one classifier;
- `seams`: the agent's seams into dspy: one predictor wrapper, and the bridges between dspy's
  synchronous loop and the agent's event loops.

Nothing is imported here: each module is imported by name (the kernel sits below the engine
and the chat agent, and above `runners`).
"""
