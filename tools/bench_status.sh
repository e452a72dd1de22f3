#!/usr/bin/env bash
# The performance issue's figures in one command: every run its "Must show" names, on this machine's engines, then
# one table of each target beside what was measured (tools/bench_status.py). BENCHMARKS.md's "Where performance
# stands" is this script's output on a quiet machine.
#
#   tools/bench_status.sh /tmp/bench-status          # about 20 minutes; MEMORY=1 adds the 100,000-request checks
#
# Runs one after another (never two at once: they would measure each other). Each run checks exactly-once in the
# database and exits 1 if it does not hold, which stops this script.
set -euo pipefail
out=${1:?usage: tools/bench_status.sh OUTPUT_DIR}
bin=${IDEM_DIALECTS:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/idem-dialects}
levels=${LEVELS:-1,8,32}
mkdir -p "$out"
run() { echo "== $*" >&2; "$bin" bench "$@" --quiet --format json; }

run --engine postgresql --engine mariadb --workers "$levels" --requests 1000 --repetitions 5 > "$out/sync.json"
for driver in asyncpg psycopg; do
  run postgresql --api async --driver "$driver" --concurrency "$levels" --requests 2000 > "$out/async-postgresql-$driver.json"
done
run --engine mariadb --engine sqlite --api async --concurrency "$levels" --requests 2000 > "$out/async-others.json"
run postgresql --api http --concurrency "$levels" --requests 2000 > "$out/http.json"
if [ "${MEMORY:-0}" = 1 ]; then
  run --engine sqlite --engine postgresql --engine mariadb --requests 100 --repetitions 1 --warmup 10 \
    --memory-check 100000 > "$out/memory.json"
fi
python3 "$(dirname "$0")/bench_status.py" "$out"
