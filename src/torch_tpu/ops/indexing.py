"""Lowerings: indexing family."""

from __future__ import annotations
