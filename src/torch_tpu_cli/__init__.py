"""torch-tpu: verify the device, check how ready a program is for a TPU, migrate CUDA code,
diagnose the environment, inspect op coverage and the compilation cache.

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
    check = commands.add_parser(
        "check", help="run a script or model on cpu and tpu and report how ready it is"
    )
    check.add_argument(
        "script",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT.py ...",
        help="the script and its arguments (check's options come first)",
    )
    check.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="factory() returns (model, example_inputs[, loss_fn])",
    )
    check.add_argument(
        "--modes",
        type=lambda text: [m for m in text.split(",") if m],
        metavar="M1,M2",
        help="of strict,fused,compiled (default: all; a script: strict,fused)",
    )
    check.add_argument("--steps", type=int, default=5, help="training steps per run (default 5)")
    check.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    check.add_argument("--json", metavar="PATH", help="write the report as JSON")
    check.add_argument("--plot", metavar="PATH.png", help="plot step time over steps per mode")
    migrate = commands.add_parser("migrate", help="rewrite CUDA-specific code for the tpu device")
    migrate.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    migrate.add_argument("--write", action="store_true", help="write the changes (default: show)")
    migrate.add_argument("--diff", action="store_true", help="print a unified diff")
    commands.add_parser("doctor", help="check the environment and say what to fix")
    return parser


def _tools_missing(e: ImportError) -> int:
    print(
        f"torch-tpu: this command needs {e.name}, from the tools extra: "
        "pip install -c constraints.txt -e '.[tools]'"
    )
    return 2


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
    if args.command in ("check", "migrate", "doctor"):
        try:
            return _porting_tool(args)
        except ImportError as e:
            if e.name in ("rich", "matplotlib", "libcst"):
                return _tools_missing(e)
            raise
    from torch_tpu.cli.opinfo_report import run

    return run(args.out, args.limit, args.only, args.known_failures)


def _porting_tool(args: argparse.Namespace) -> int:
    if args.command == "check":
        from torch_tpu.cli.check import run

        script, script_args = (args.script[0], args.script[1:]) if args.script else (None, [])
        return run(
            script,
            script_args,
            args.model,
            args.modes,
            args.steps,
            args.timeout,
            args.json,
            args.plot,
        )
    if args.command == "migrate":
        from torch_tpu.cli.migrate import run

        return run(args.paths, args.write, args.diff)
    from torch_tpu.cli.doctor import run

    return run()
