"""The sweep: every part at each N, a table of the figures, each part's goals judged (run or fitted)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

from tools.bench.scale_sim.goals import Goal, Row, fit, judge

PARTS = ("store", "folder", "slurm")
FITTED_AT = (4096, 16384)


def table(name: str, rows: list[Row]) -> None:
    """The rows, a column a figure, then each figure fitted at 4,096 and 16,384 ranks."""
    keys = list(rows[0])
    width = max(map(len, keys)) + 2
    run = " ".join(f"{int(r['ranks']):>10}" for r in rows)
    print(f"\n{name}: {run} ranks run; {' '.join(f'{n:>10}' for n in FITTED_AT)} fitted")
    for k in keys[1:]:
        run = " ".join(f"{r[k]:>10.4g}" for r in rows)
        fitted = " ".join(f"{fit(rows, k, n):>10.4g}" for n in FITTED_AT) if len(rows) > 1 else ""
        print(f"{k:>{width}}: {run}  {fitted}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.scale_sim", description=__doc__)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--json", type=Path, help="write every part's rows here")
    ap.add_argument("--discard", action="store_true",
                    help="store: the proxies keep the files' zeros as their sizes, the store none of their bytes")
    ap.add_argument("--upload-rate", type=float,
                    help="store: checkpoint.upload_rate, the job's writes a second (default: its default, 3,500)")
    args = ap.parse_args(argv)
    out: dict[str, list[Row]] = {}
    ok = True
    with tempfile.TemporaryDirectory(prefix="scale-sim-") as tmp:
        for name in args.parts:
            part = importlib.import_module(f"tools.bench.scale_sim.{name}")
            rows = []
            for n in sorted(args.ranks):
                options = {"discard": args.discard, "upload_rate": args.upload_rate} if name == "store" else {}
                rows.append(part.measure(n, Path(tmp) / name, **options))
                print(f"  {name} at {n} ranks: {json.dumps({k: round(v, 4) for k, v in rows[-1].items()})}",
                      flush=True)
            out[name] = rows
            table(name, rows)
            goals: tuple[Goal, ...] = part.GOALS
            for goal in goals:
                verdict = judge(rows, goal)
                ok &= verdict.passed
                print(verdict.line())
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print("\nPASS" if ok else "\nFAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
