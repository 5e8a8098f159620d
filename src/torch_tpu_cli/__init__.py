"""torch-tpu: verify the device, inspect op coverage and the compilation cache, write the
OpInfo report.

The console script's entry point lives outside the torch_tpu package on purpose:
importing anything inside torch_tpu imports torch first (seconds), and `--help`
or a typo must answer at once. Each subcommand imports what it needs.
"""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torch-tpu", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="check the tpu device and train a small MLP")
    verify.add_argument("--steps", type=int, default=5, help="MLP training steps (default 5)")
    ops = commands.add_parser("ops", help="which ATen ops are lowered, decomposed or fall back")
    ops.add_argument("--check", metavar="OPNAME", help="how one op (e.g. add or add.Tensor) runs")
    report = commands.add_parser("opinfo-report", help="full OpInfo sweep -> docs/opinfo_report.*")
    report.add_argument("--out", default="docs", help="directory for the report (default docs)")
    report.add_argument(
        "--limit", type=int, default=None, help="samples per entry and dtype (default: as CI)"
    )
    report.add_argument("--only", nargs="*", help="OpInfo entry names to run (default: all)")
    report.add_argument(
        "--known-failures", metavar="PATH", help="also write every failing cell, with its reason"
    )
    cache = commands.add_parser("cache", help="the persistent compilation cache")
    cache.add_argument("action", choices=["info", "clear"], help="show its state, or empty it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "verify":
        from torch_tpu.cli.verify import run

        return run(steps=args.steps)
    if args.command == "ops":
        from torch_tpu.cli.ops import run

        return run(args.check)
    if args.command == "cache":
        from torch_tpu.cli.cache import run

        return run(args.action)
    from torch_tpu.cli.opinfo_report import run

    return run(args.out, args.limit, args.only, args.known_failures)
