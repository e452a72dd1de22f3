#!/usr/bin/env bash
# BENCHMARKS.md from one command: every bench run the page quotes, one after another, then the page from their JSON
# reports (tools/benchmarks/: the plan, the runner, the targets and the page's text).
#
#   tools/benchmarks.sh /tmp/bench [--before ../before] [--memory] [--conformance] [--smoke] [--render-only]
#
# Runs this checkout's .venv (the --before checkout runs its own). `tools/benchmarks.sh --help` lists the options.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Not PYTHONPATH: the runs inherit the environment, and a --before checkout must import its own code, not this one's.
exec "${PYTHON:-$root/.venv/bin/python}" -c 'import sys; sys.path.insert(0, sys.argv.pop(1))
from tools.benchmarks.__main__ import main; sys.exit(main())' "$root" "$@"
