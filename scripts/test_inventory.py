"""The suite never shrinks unseen: every test named in tests/inventory.txt is still collected.

    python scripts/test_inventory.py           # check (CI): exit 1 if a listed test is gone
    python scripts/test_inventory.py --write   # add the tests collected now to the list

A test that is renamed or removed on purpose leaves the list by hand, in the same commit, where
a reviewer sees it; new tests are added with --write (the check fails until they are listed, so
the list stays the whole suite).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "tests" / "inventory.txt"


def collected() -> list[str]:
    """Node ids pytest collects from the repository's test paths (in one process, no xdist)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    if proc.returncode != 0 or not ids:
        sys.exit(f"collection failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return ids


def listed() -> list[str]:
    lines = INVENTORY.read_text().splitlines() if INVENTORY.exists() else []
    return [x for x in lines if x and not x.startswith("#")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="add the tests collected now")
    args = ap.parse_args()
    now, before = collected(), listed()
    gone = sorted(set(before) - set(now))
    new = sorted(set(now) - set(before))
    print(f"tests listed {len(before)}, collected {len(now)}: {len(gone)} gone, {len(new)} new")
    if args.write:
        header = [x for x in INVENTORY.read_text().splitlines() if x.startswith("#")]
        INVENTORY.write_text("\n".join([*header, *sorted(set(before) | set(now))]) + "\n")
        print(f"{INVENTORY.relative_to(REPO)}: {len(new)} added")
        return 1 if gone else 0
    for x in gone:
        print(f"  gone: {x}")
    for x in new:
        print(f"  new (not listed): {x}")
    if gone:
        print(
            "a listed test is no longer collected: restore it, or remove its line from "
            f"{INVENTORY.relative_to(REPO)} in the same commit, saying why"
        )
    if new:
        print("run `python scripts/test_inventory.py --write` to list the new tests")
    return 1 if gone or new else 0


if __name__ == "__main__":
    sys.exit(main())
