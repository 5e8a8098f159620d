"""torch-tpu: verify the device and run a small workload."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-tpu", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="check the tpu device and train a small MLP")
    verify.add_argument("--steps", type=int, default=5, help="MLP training steps (default 5)")
    args = parser.parse_args(argv)
    if args.command == "verify":
        from .verify import run

        return run(steps=args.steps)
    return 2
