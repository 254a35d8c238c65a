"""Test harness: a real nats-server per test session, real service processes, bounded waits.

Load the fixtures with `pytest_plugins = ["fleet_harness.fixtures"]`.
"""
