"""Sandbox providers: `local` (processes on this host) and, in its own issue, `daytona`."""
