"""`idem-dialects engines` output: each catalogue engine, available here or not, how, or what would enable it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .text import table, wrap


def render_engines(report: Mapping[str, Any], fmt: str = "table") -> str:
    found = report["engines"]
    if fmt == "markdown":
        rows = [[name, "available" if i["available"] else "unavailable", str(i["title"]),
                 f"{i['how']} ({i['server_version']})" if i["available"] else
                 f"{i['reason']}; to enable: {i['hint'] or 'set ' + str(i['env_var']) + '=<SQLAlchemy URL>'}"]
                for name, i in found.items()]
        return "\n".join(table(["engine", "status", "title", "how / why not"], rows, markdown=True)) + "\n"
    out: list[str] = []
    for name, info in found.items():
        if info["available"]:
            out += wrap(f"{info['title']}: {info['how']} ({info['server_version']})", " " * 28,
                        first=f"{name:<14} available    ")
        else:
            out += wrap(f"{info['title']}: {info['reason']}", " " * 28, first=f"{name:<14} unavailable  ")
            hint = info["hint"] or "set " + str(info["env_var"]) + "=<SQLAlchemy URL>"
            out += wrap(hint, " " * 28, first=f"{'':<14} to enable:   ")
    env = next((str(i["env_var"]) for n, i in found.items() if n == "mssql-2022"), "IDEM_URL_<NAME>")
    out += ["", f"URLs come from IDEM_URL_<NAME> (e.g. {env}); `idem-dialects matrix` runs the suite on every"
                " available engine."]
    return "\n".join(out) + "\n"
