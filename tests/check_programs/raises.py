"""Fails at once, on every device."""

raise ValueError("this script is broken on purpose")
