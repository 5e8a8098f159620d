"""Lowerings: shape family."""

from __future__ import annotations
