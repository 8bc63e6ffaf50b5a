"""Deprecated alias of :mod:`rollbuf.integrations.llm` (importing it warns)."""

from rollbuf.integrations._deprecated import alias

alias("rollbuf.llm", "rollbuf.integrations.llm", globals())
del alias
