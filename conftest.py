pytest_plugins = ["fleet_harness.fixtures"]
