#!/usr/bin/env bash
# Issue 18's before/after figures (BENCHMARKS.md): the same `idem-dialects bench` runs with a "before" checkout and
# with this one, alternately per engine and worker count, so both see the same machine state.
#
#   git worktree add --detach ../before && git -C ../before apply "$PWD/tools/bench_before_18.patch"
#   (cd ../before && python3 -m venv .venv && .venv/bin/pip install -q -e '.[all]')
#   tools/bench_ab.sh ../before /tmp/ab && python3 tools/bench_ab.py /tmp/ab
#
# tools/bench_before_18.patch switches the issue's changes off (PostgreSQL's claim_or_read, the SQLite deferred
# claim_transaction, MySQL/MariaDB's pool reset skip, the narrower winner read); every other line is this checkout's.
set -euo pipefail
before=$(cd "$1" && pwd)
out=$2
after=$(cd "$(dirname "$0")/.." && pwd)
engines=${ENGINES:-sqlite postgresql-18 postgresql mariadb}
requests=${REQUESTS:-1000}
repetitions=${REPETITIONS:-5}
mkdir -p "$out"
for engine in $engines; do
  for workers in 1 8; do
    for side in before after; do
      tree=$before; [ "$side" = after ] && tree=$after
      echo "== $engine, $workers workers, $side" >&2
      "$tree/.venv/bin/idem-dialects" bench "$engine" --workers "$workers" --requests "$requests" \
        --repetitions "$repetitions" --quiet --format json --output "$out/$side-$engine-$workers.json"
    done
  done
  for side in before after; do
    tree=$before; [ "$side" = after ] && tree=$after
    echo "== $engine, async store, 8 tasks, $side" >&2
    "$tree/.venv/bin/idem-dialects" bench "$engine" --api async --concurrency 8 --requests "$requests" \
      --format json > "$out/$side-$engine-async.json"
  done
done
