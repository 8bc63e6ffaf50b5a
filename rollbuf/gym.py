"""Deprecated alias of :mod:`rollbuf.integrations.gym` (importing it warns)."""

from rollbuf.integrations._deprecated import alias

alias("rollbuf.gym", "rollbuf.integrations.gym", globals())
del alias
