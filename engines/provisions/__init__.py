"""Each backend's test provisioning (`entry.Provision` subclasses), one module per engine as SQLAlchemy keeps its
``dialects/<engine>/provision.py``: container recipes, private servers, the fault proxy's wire protocol, how a check
ends a session, and the facts the benchmark measures against. Loaded only by the catalogue and the conformance
suite; the library never imports them."""
