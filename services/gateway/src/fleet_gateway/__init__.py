"""The gateway service: the HTTP/WebSocket edge of the mesh.

Owns: the FastAPI app, `/health`, `/ready` and `/asyncapi.json` (the bus document beside the
OpenAPI), and, in later issues, auth, sessions, turns, traces and the UI. It runs on the common
service runtime (`fleet_mesh.service`), with uvicorn inside it.
Consumes: the session streams (later); pings every service for `/ready`.
Emits: commands on behalf of clients (later). Answers `fleet.rpc.gateway.ping` like every service.
"""
