import os
import tempfile

pytest_plugins = ["fleet_harness.fixtures"]

# The CLI remembers the last mesh a user started (fleet_cli.localmesh, under XDG_STATE_HOME).
# The suite must neither read the reminder of a mesh running beside it on this machine nor
# leave its own meshes in the user's: every test process and the processes it starts get a
# state home of their own.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="fleet-test-state-")
