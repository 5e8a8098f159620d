"""Lowerings: nn family."""

from __future__ import annotations
