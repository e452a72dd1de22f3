"""How a class's contract is counted, for the tests that cap it (test_contract.py) and that read it on the development
page (test_development_page.py)."""

from __future__ import annotations


def own_members(cls: type) -> list[str]:
    """The public members a class declares itself: the contract a subclass author reads. Annotations count: a member
    declared only by its type (`name: ClassVar[str]`, which every backend must set) is not in `vars()`."""
    declared = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    return sorted(name for name in declared if not name.startswith("_"))
