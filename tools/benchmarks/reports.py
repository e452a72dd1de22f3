"""The reports of one output directory, found by the run that wrote them (manifest.json), never by guessing: each
accessor returns the report (one engine at one level) or None, and `missing` says why a table cell stays empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .measure import Manifest
from .plan import ab_id

Report = dict[str, Any]

# Why a run that the manifest does not hold was not made: the option that adds it.
NOT_RUN = {"memory": "not run: add --memory", "conformance": "not run: add --conformance",
           "ab": "not run: add --before CHECKOUT"}
BACKENDS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mariadb": "MariaDB", "mysql": "MySQL",
            "mssql": "SQL Server", "oracle": "Oracle"}


class Reports:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.manifest = Manifest.load(out).data
        self._cache: dict[str, list[Report]] = {}

    # --- the runs ----------------------------------------------------------------------------------------------

    def entry(self, run_id: str) -> dict[str, Any] | None:
        entry: dict[str, Any] | None = self.manifest["runs"].get(run_id)
        return entry

    def runs(self, run_id: str) -> list[Report]:
        """The reports a run wrote (a set's runs, flattened), none if it did not run or wrote nothing."""
        if run_id not in self._cache:
            entry = self.entry(run_id)
            found: list[Report] = []
            if entry is not None and entry["status"] == "ok" and (self.out / entry["file"]).exists():
                report = json.loads((self.out / entry["file"]).read_text())
                found = list(report.get("runs", [report])) if "schema" in report else [report]
            self._cache[run_id] = found
        return self._cache[run_id]

    def missing(self, run_id: str, kind: str = "") -> str:
        """Why a run's figures are not on the page."""
        entry = self.entry(run_id)
        if entry is None:
            return NOT_RUN.get(kind, "not run")
        if entry["status"] == "unavailable":
            return f"unavailable here ({entry.get('reason', '')})"
        if entry["status"] == "failed":
            return f"failed ({entry.get('reason', '')})"
        return "not measured at this level"

    def at(self, run_id: str, level: int | None, key: str = "workers") -> Report | None:
        for report in self.runs(run_id):
            config = report.get("config", {})
            if level is None or int(config.get(key) or config.get("concurrency") or 0) == level:
                return report
        return None

    # --- by kind -----------------------------------------------------------------------------------------------

    def sync(self, engine: str, workers: int) -> Report | None:
        return self.at(f"sync-{engine}", workers)

    def aio(self, engine: str, driver: str, tasks: int) -> Report | None:
        return self.at(f"async-{engine}-{driver}", tasks, "concurrency")

    def http(self, engine: str, connections: int) -> Report | None:
        return self.at(f"http-{engine}", connections, "concurrency")

    def telemetry(self, engine: str) -> Report | None:
        return self.at(f"telemetry-{engine}", None)

    def memory(self, engine: str) -> Report | None:
        return self.at(f"memory-{engine}", None)

    def consumer(self) -> list[Report]:
        return self.runs("consumer")

    def conformance(self) -> Report | None:
        entry = self.entry("conformance")
        if entry is None or entry["status"] != "ok" or not (self.out / entry["file"]).exists():
            return None
        report: Report = json.loads((self.out / entry["file"]).read_text())
        return report

    def ab(self, side: str, rnd: int, api: str, engine: str, driver: str, level: int) -> Report | None:
        found = self.runs(ab_id(side, rnd, api, engine, driver, level))
        return found[0] if found else None

    def ab_rounds(self) -> list[int]:
        return sorted({e["round"] for e in self.manifest["runs"].values() if e.get("round") is not None})

    # --- what the runs have in common --------------------------------------------------------------------------

    def all_reports(self) -> list[Report]:
        return [r for run_id in self.manifest["runs"] for r in self.runs(run_id)]

    def label(self, engine: str) -> str:
        """An engine's name on the page: its backend and the server version a report saw, else its catalogue name."""
        for report in self.all_reports():
            info = report.get("engine", {})
            if info.get("name") == engine and info.get("server_version"):
                return f"{BACKENDS.get(info['backend'], info['backend'])} {info['server_version']}"
        return engine
