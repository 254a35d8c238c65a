"""NATS plumbing shared by every service: connection, bootstrap, the event store on
JetStream, the object-store blob store, request/reply helpers, the service runner and the
embedded nats-server process. Imports `fleet_events`; imports no service."""
