"""Running the idem-dialects command as a user does, in processes of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CLI = [sys.executable, "-m", "idem_dialects.cli"]

# Runs several command lines (JSON on stdin), each in a child forked from one interpreter that imported the command
# once: every command is still a process of its own (its own state, stderr and exit status), without paying the
# interpreter's start and imports again. Prints each one's [status, stdout, stderr] as JSON.
FORKED = """
import json, os, sys, tempfile, traceback
from idem_dialects.cli import main
done = []
for argv in json.load(sys.stdin):
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
            sys.argv = ["idem-dialects", *argv]
            try:
                status = main(argv)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                traceback.print_exc(); status = 1
            sys.stdout.flush(); sys.stderr.flush(); os._exit(status)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out.seek(0); err.seek(0)
        done.append([status, out.read(), err.read()])
json.dump(done, sys.stdout)
"""


def run(prefix: Sequence[str], args: Sequence[str], cwd: Path, stdin: str | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`prefix + args` in a subprocess, as a shell without pytest's options runs it."""
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([*prefix, *args], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)


def run_each(commands: Sequence[Sequence[str]], cwd: Path, prefix: Sequence[str] = (),
             timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """Each command line (the command's arguments) run as `run(prefix + CLI, ...)` runs it, in one interpreter's forked
    children (FORKED): the interpreter starts and imports the library once."""
    batch = run([*prefix, sys.executable, "-c", FORKED], [], cwd, stdin=json.dumps(commands), timeout=timeout)
    assert batch.returncode == 0, batch.stderr
    return [subprocess.CompletedProcess(list(command), status, out, err)
            for command, (status, out, err) in zip(commands, json.loads(batch.stdout), strict=True)]
