"""The gateway service: the HTTP/WebSocket edge of the mesh.

Owns: the FastAPI app, `/health` and `/ready` (and, in later issues, auth, sessions, turns,
traces and the UI). Consumes: the session streams (later); pings every service for `/ready`.
Emits: commands on behalf of clients (later). Answers `fleet.rpc.gateway.ping` like every service.
"""
