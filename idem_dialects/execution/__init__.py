"""How the stores execute a flow's statements: compiled once per dialect and driver (`plan`), run on a sync DBAPI
cursor or through SQLAlchemy (`sync`), or on an async driver's own API (`aio`)."""
