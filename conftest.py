import os
import tempfile
from pathlib import Path

from fleet_events.access import ADMIN
from fleet_mesh.credentials import CREDENTIALS_DIR_ENV, CREDENTIALS_ENV, SUFFIX, ensure_credentials

pytest_plugins = ["fleet_harness.fixtures"]

# The CLI remembers the last mesh a user started (fleet_cli.localmesh, under XDG_STATE_HOME).
# The suite must neither read the reminder of a mesh running beside it on this machine nor
# leave its own meshes in the user's: every test process and the processes it starts get a
# state home of their own.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="fleet-test-state-")

# A tenant's LLM profile may reach public addresses only (fleet_events.addresses); the suite's
# model servers are fakes on loopback, so this test deployment allows loopback, as an operator
# would allow an internal range. The tests of the policy clear it for their own processes.
os.environ.setdefault("FLEET_EGRESS_ALLOW", "127.0.0.0/8")

# Every NATS server of the suite requires credentials, one NKey user per role with the
# permissions the bus catalog gives it (fleet_events.access), as `fleet up`'s servers do: a
# service that does what its access table does not say fails its test here. The test process
# itself is the admin; each service the harness starts gets its own role's seed.
_credentials = ensure_credentials(Path(tempfile.mkdtemp(prefix="fleet-test-nats-")) / "creds")
os.environ[CREDENTIALS_DIR_ENV] = str(_credentials.directory)
# (the admin's path spelled out: mutation testing makes fleet_events.access's functions fail)
os.environ[CREDENTIALS_ENV] = str(_credentials.directory / f"{ADMIN}{SUFFIX}")
