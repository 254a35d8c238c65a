"""The `daytona` provider: sandboxes on Daytona through the pinned SDK (`AsyncDaytona`).

Imported only when a deployment selects it (`FLEET_SANDBOX_PROVIDER=daytona`): the SDK reads
`.env` and raises without a key at construction, so nothing here runs for the local provider.
"""
