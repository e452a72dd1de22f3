"""`idem-dialects engines` output: the catalogue as listed (how each engine would be provided), or as probed
(`--probe`: available here or not, how, or what would enable it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .text import table, wrap

INDENT = " " * 28


def state(info: Mapping[str, Any]) -> tuple[str, str]:
    """(status word, what to say) for one engine, listed or probed."""
    if "available" not in info:  # listed: nothing was started, so nothing is known to answer
        return "listed", f"{info['title']}: " + "; else ".join(info["providers"])
    if info["available"]:
        return "available", f"{info['title']}: {info['how']} ({info['server_version']})"
    return "unavailable", f"{info['title']}: {info['reason']}"


def enable(info: Mapping[str, Any]) -> str:
    return str(info["hint"] or f"set {info['env_var']}=<SQLAlchemy URL>")


def render_engines(report: Mapping[str, Any], fmt: str = "table") -> str:
    found = report["engines"]
    probed = report.get("probed", True)  # reports saved before listing existed were all probed
    if fmt == "markdown":
        rows = []
        for name, info in found.items():
            word, text = state(info)
            rows.append([name, word, text if word != "unavailable" else f"{text}; to enable: {enable(info)}"])
        return "\n".join(table(["engine", "status", "how / why not"], rows, markdown=True)) + "\n"
    out: list[str] = []
    for name, info in found.items():
        word, text = state(info)
        if word == "listed":
            out += wrap(text, " " * 15, first=f"{name:<14} ")
            continue
        out += wrap(text, INDENT, first=f"{name:<14} {word:<12} ")
        if word == "unavailable":
            out += wrap(enable(info), INDENT, first=f"{'':<14} {'to enable:':<12} ")
    env = next((str(i["env_var"]) for i in found.values()), "IDEM_URL_SQLITE")
    out += ["", *wrap(f"URLs come from IDEM_URL_<NAME> (e.g. {env}); `idem-dialects matrix` runs the suite on every"
                      " available engine.")]
    if not probed:
        out += wrap("Nothing was started: `idem-dialects engines --probe` provides each engine and says which answer"
                    " here.")
    return "\n".join(out) + "\n"
