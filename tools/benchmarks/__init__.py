"""BENCHMARKS.md from one command: every `idem-dialects bench` run the page quotes, one after another, then the page.

    tools/benchmarks.sh OUTPUT_DIR [--before CHECKOUT] [--memory] [--conformance] [--smoke] [--render-only]

- `plan`: which runs (engines, APIs, drivers, concurrency levels, sizes), each a command line of the project's CLI;
  the before/after pairs when another checkout is given;
- `measure`: runs them in turn (never two at once: they would measure each other), each report to OUTPUT_DIR, and
  records what ran, how long, under what load, in OUTPUT_DIR/manifest.json;
- `targets`: the performance targets, each beside what the reports show (met, missed, or not measured);
- `render`: the tables, filled into the page's text (`BENCHMARKS.md.in`), written to BENCHMARKS.md.

`python -m tools.benchmarks --help` from the repository's root says the rest.
"""
