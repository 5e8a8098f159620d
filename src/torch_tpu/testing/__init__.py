"""Test support shipped with the package: the OpInfo harness."""
