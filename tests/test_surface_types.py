"""mypy holds every store type against the declared surface (`idem_dialects.api`; each store module ends with the
check), and that check has teeth: a class with every member of `StoreAPI` passes, the same class missing one member
fails, naming it. The class is made from the Protocol's own text, so it follows the surface as it changes."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy (the [dev] extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "idem_dialects" / "api.py"


def implementation(protocol: str, without: str | None) -> str:
    """A module with a class implementing `protocol` member for member (bodies raise), less the member `without`, and
    the assignment that makes mypy hold it against the Protocol."""
    tree = ast.parse(API.read_text(encoding="utf-8"))
    guarded = [n for node in tree.body if isinstance(node, ast.If) for n in node.body]  # if TYPE_CHECKING:
    imports = [node for node in [*tree.body, *guarded] if isinstance(node, (ast.Import, ast.ImportFrom))
               and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    source = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == protocol)
    members = []
    for node in source.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != without:
            node.body = [ast.Raise(exc=ast.Name(id="NotImplementedError", ctx=ast.Load()))]
            members.append(node)
    made = ast.ClassDef(name="Made", bases=[ast.parse("Generic[C]", mode="eval").body], keywords=[], body=members,
                        decorator_list=[], type_params=[])
    tail = ast.parse(f"def held(it: Made[Any]) -> idem_dialects.api.{protocol}[Any]:\n    return it\n").body
    module = ast.Module(body=[ast.parse("from __future__ import annotations").body[0], *imports,
                              *ast.parse("from typing import Generic\nimport idem_dialects.api\n"
                                         "from idem_dialects.api import C, T, ClaimFlows, OutboxFlows").body,
                              made, *tail], type_ignores=[])
    # The Protocol's relative imports, absolute here.
    return ast.unparse(ast.fix_missing_locations(module)).replace("from .", "from idem_dialects.")


@pytest.mark.slow  # mypy on the library and SQLAlchemy from a cold cache
def test_a_store_missing_one_member_fails_the_surface_check(tmp_path: Path) -> None:
    cases = {"sync_whole": ("StoreAPI", None), "sync_no_stats": ("StoreAPI", "stats"),
             "async_whole": ("AsyncStoreAPI", None), "async_no_add_command": ("AsyncStoreAPI", "add_command")}
    for name, (protocol, without) in cases.items():
        (tmp_path / f"{name}.py").write_text(implementation(protocol, without), encoding="utf-8")
    os.environ["MYPYPATH"] = str(ROOT)
    out, err, status = mypy_api.run(["--strict", "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"),
                                     *(str(tmp_path / f"{name}.py") for name in cases)])
    errors = [line for line in (out + err).splitlines() if ": error:" in line or ": note:" in line]
    assert status == 1, out + err
    assert {Path(line.split(":")[0]).stem for line in errors} == {"sync_no_stats", "async_no_add_command"}, errors
    said = "\n".join(errors)
    for name, protocol, member in (("sync_no_stats", "StoreAPI", "stats"),
                                   ("async_no_add_command", "AsyncStoreAPI", "add_command")):
        mine = [line.split(": ", 2)[2] for line in errors if Path(line.split(":")[0]).stem == name]
        assert mine[1:] == [f'"Made" is missing following "{protocol}" protocol member:', f"    {member}"], said
