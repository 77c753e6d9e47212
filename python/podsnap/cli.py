"""The `podsnap` command."""

from __future__ import annotations

import argparse
import sys

from podsnap import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="podsnap", description=__doc__)
    parser.add_argument("--version", action="version", version=f"podsnap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="capture -> restore -> request of the demo worker on this host (not built yet)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        print("podsnap demo: not built yet (issue 4: node engine, workload SDK, demo worker and CLI)", file=sys.stderr)
        return 2
    build_parser().print_help()
    return 0
