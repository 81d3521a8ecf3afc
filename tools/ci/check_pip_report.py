"""Read a `pip install --report` file and prove what a core install of fd-guided brings.

    python tools/ci/check_pip_report.py REPORT.json              # a fresh venv: core only
    python tools/ci/check_pip_report.py REPORT.json --host-paddle  # a host venv that has Paddle

Fails (exit 1) when the install would bring any Paddle distribution (``paddlepaddle``,
``paddlepaddle-gpu``, ...), or a package that only fd-guided's extras ask for, unless one of the
engines fd-guided depends on requires it itself (xgrammar asks for transformers and pydantic:
those arrive with xgrammar, not from us, and the table says so). With ``--host-paddle`` it also
fails when a Paddle distribution is reinstalled or replaced. Prints what would be installed and
why. Standard library only: it runs in a fresh venv.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    return canonical(match.group(1)) if match else ""


def is_paddle(name: str) -> bool:
    return canonical(name).startswith("paddlepaddle") or canonical(name) == "paddle"


def split_requires(requires: list[str]) -> tuple[set[str], set[str]]:
    """(core requirement names, names that only some extra asks for)."""
    core, extra = set(), set()
    for requirement in requires:
        (extra if re.search(r"extra\s*==", requirement) else core).add(requirement_name(requirement))
    return core, extra - core


def check(report: dict, host_paddle: bool) -> list[str]:
    installs = report.get("install", [])
    names = {canonical(item["metadata"]["name"]): item for item in installs}
    ours = names.get("fd-guided")
    if ours is None:
        return ["the report does not install fd-guided"]
    _, extras_only = split_requires(ours["metadata"].get("requires_dist", []))
    required_by: dict[str, list[str]] = {}
    for name, item in names.items():
        if name == "fd-guided":
            continue
        for requirement in item["metadata"].get("requires_dist", []):
            if not re.search(r"extra\s*==", requirement):
                required_by.setdefault(requirement_name(requirement), []).append(name)
    problems = []
    for name, item in sorted(names.items()):
        version = item["metadata"]["version"]
        why = ""
        if is_paddle(name):
            problems.append(f"{name} {version}: a Paddle distribution would be "
                            + ("reinstalled or replaced over the host's" if host_paddle else "installed"))
            why = "PADDLE"
        elif name in extras_only:
            if required_by.get(name):
                why = f"an extra of ours, but required by {', '.join(sorted(required_by[name]))} itself"
            else:
                problems.append(f"{name} {version}: only fd-guided's extras ask for it, yet a core install brings it")
                why = "EXTRA ONLY"
        print(f"  {name:32} {version:14} {why}")
    print(f"{len(names)} distributions in the resolution")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--host-paddle", action="store_true", help="the venv already has a Paddle distribution")
    args = parser.parse_args(argv)
    with open(args.report, encoding="utf-8") as handle:
        report = json.load(handle)
    problems = check(report, args.host_paddle)
    for problem in problems:
        print("FAIL:", problem, file=sys.stderr)
    if not problems:
        print("OK: no Paddle distribution and no extras-only package in the core install")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
