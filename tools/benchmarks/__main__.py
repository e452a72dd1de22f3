"""`python -m tools.benchmarks OUTPUT_DIR [...]` (or `tools/benchmarks.sh`): measure, then write BENCHMARKS.md."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from .measure import Checkout, Manifest, RunFailed, dropped_options, execute, now
from .plan import SMOKE, Side, Sizes, ab_runs, main_runs
from .render import render, terminal

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("sync", "async", "http", "telemetry", "consumer", "memory", "conformance", "ab")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/benchmarks.sh", description=(
        "Run every bench BENCHMARKS.md quotes, one after another, then write the page from their JSON reports."
        " About 20 minutes on a quiet 2-core machine; --memory adds about 12, --before about 25 for 3 rounds (45"
        " when both checkouts' async benches take --repetitions), --conformance the suite's own time."))
    p.add_argument("out", metavar="OUTPUT_DIR", type=Path, help="where the reports, logs and manifest.json go")
    p.add_argument("--before", metavar="CHECKOUT", type=Path,
                   help="another checkout with its own .venv: the sync and async store's benches on both, alternately")
    p.add_argument("--rounds", type=int, metavar="N", help="before/after rounds (default 3; --smoke: 1)")
    p.add_argument("--memory", action="store_true", help="also 100,000 requests under tracemalloc on each engine")
    p.add_argument("--conformance", action="store_true",
                   help="also the conformance suite on every engine here, sync and async (idem-dialects matrix)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the command end to end, not the figures")
    p.add_argument("--only", action="append", choices=KINDS, metavar="KIND",
                   help=f"run only these kinds ({', '.join(KINDS)}; repeatable); the page renders all it finds")
    p.add_argument("--resume", action="store_true", help="keep the runs OUTPUT_DIR already holds; run the rest")
    p.add_argument("--render-only", action="store_true", help="measure nothing: the page from OUTPUT_DIR's reports")
    p.add_argument("--output", type=Path, metavar="FILE", help="where the page goes (default: this checkout's"
                   " BENCHMARKS.md; after a --smoke run: OUTPUT_DIR/BENCHMARKS.md)")
    return p


def measure(args: argparse.Namespace, out: Path) -> None:
    sizes: Sizes = SMOKE if args.smoke else Sizes()
    if args.rounds is not None:
        sizes = replace(sizes, ab_rounds=args.rounds)
    checkouts: dict[Side, Checkout] = {"after": Checkout("after", ROOT)}
    if args.before is not None:
        checkouts["before"] = Checkout("before", args.before.resolve())
    for checkout in checkouts.values():
        if (problem := checkout.problem()) is not None:
            raise SystemExit(f"tools/benchmarks.sh: {problem}")
    manifest = Manifest.start(out, sys.argv, sizes, args.smoke, checkouts.values(), args.resume)
    wanted = set(args.only or KINDS)
    runs = [run for run in main_runs(sizes, args.memory, args.conformance) if run.kind in wanted]
    ab = ab_runs(sizes) if "before" in checkouts and "ab" in wanted else []
    dropped = dropped_options(ab, checkouts, manifest) if ab else frozenset()
    try:
        for run in [*runs, *ab]:
            if args.resume and manifest.done(run):
                continue
            execute(run, checkouts[run.side], manifest, dropped if run.round is not None else frozenset())
    finally:
        manifest.data["finished"] = now()
        manifest.save()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out: Path = args.out.resolve()
    if not args.render_only:
        try:
            measure(args, out)
        except RunFailed as exc:
            print(f"tools/benchmarks.sh: {exc}\nBENCHMARKS.md not written: a run could not vouch for its figures.",
                  file=sys.stderr)
            return 1
    smoke = args.smoke or bool(Manifest.load(out).data.get("smoke"))  # a smoke run's page never replaces the real one
    target = args.output or (out / "BENCHMARKS.md" if smoke else ROOT / "BENCHMARKS.md")
    target.write_text(render(out))
    print(terminal(out))
    print(f"\nwrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
