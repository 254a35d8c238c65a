"""The gateway's application layer for sessions: create, rename, delete, purge, request a turn,
cancel, answer a clarification (`commands.SessionCommands`). Every door calls it (the REST
routes, the WebSocket frames, and later the MCP tools), so a command means one thing whichever
door it came through; it raises the domain errors of `errors` and each door says them in its
own terms (routes map them to HTTP, the socket to error frames)."""
