"""Where the PostgreSQL source connects, and as whom: a ``postgresql://`` URL, the source's
options, and libpq's own defaults (the ``PG*`` environment variables, the passfile
``~/.pgpass``, a service file), with the password kept out of everything that is logged,
shown or stored.

Rules:
  1. The URL and the options are parsed by libpq (``conninfo_to_dict``), not by us; an option
     overrides the URL's value of the same keyword. What neither gives, libpq takes from its
     environment when it connects (``PGHOST``, ``PGUSER``, ``PGPASSWORD``, ``PGPASSFILE``...):
     we pass nothing for it, so libpq's documented order holds unchanged.
  2. Secrets (``password``, ``sslpassword``) are split off at parsing into a :class:`Secret`,
     whose ``repr`` and ``str`` are ``***`` and which refuses to be pickled. A
     :class:`ConnectionOptions` pickles *without* its secrets (a copy in a checkpoint, an
     executor's task or a log record holds none); a copy that lost them connects with
     libpq's environment only, and when the server then refuses it the error says so and
     how to supply the password in that process (``PGPASSWORD``, a passfile).
  3. Nothing we write shows a password: ``repr``/``str`` of the options, :func:`redacted`
     (of a URL or a ``key=value`` string), our log lines and our errors. A refused
     connection is a :class:`ConnectionRefused` naming host, port, database and user and the
     server's reason, with any secret's text replaced by ``***`` and the driver's exception
     not chained.
  4. A server that cannot be reached, or cannot take a session yet (starting up, replaying
     WAL after a crash or as a standby not yet consistent, shutting down, out of connection
     slots: the server's SQLSTATE 57P03 and 53300 answers) is waited for when the caller asks
     (``retry_s``; the enumerator's and the readers' connections wait :data:`RECONNECT_S`):
     :meth:`ConnectionOptions.connect` tries again, pausing 0.2 s doubling to 5 s, logging
     one WARNING; a refused login (a wrong password, an unknown role or database, a database
     that does not allow connections) fails at once. libpq gives no SQLSTATE for a failed
     connection, so which is which is told by its message (:func:`transient_refusal`), each
     text as PostgreSQL 15 sends it.
  5. Every session sets ``DateStyle=ISO``, ``TimeZone=UTC``, ``bytea_output=hex``,
     ``extra_float_digits=3`` and ``client_encoding=UTF8`` (after the user's own
     ``options``, so they win): values.py reads the text forms these give.

Thread model: none inside; :meth:`ConnectionOptions.connect` opens a connection for the
calling thread (a psycopg connection is used by one thread at a time).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.sources.postgres.errors import ConnectionRefused

log = logging.getLogger(__name__)

#: the libpq keywords that hold secrets (rule 2)
SECRET_KEYWORDS = frozenset({"password", "sslpassword"})
#: option names accepted besides libpq's own keywords
ALIASES = {"database": "dbname", "username": "user"}
#: rule 5
SESSION_SETTINGS = ("-c DateStyle=ISO -c TimeZone=UTC -c bytea_output=hex "
                    "-c extra_float_digits=3")
MASK = "***"
#: how long the enumerator's and the readers' connections wait for a server that is down
RECONNECT_S = 60.0
#: rule 4: what libpq says when the server cannot be reached or the connection broke...
_UNREACHABLE = ("connection refused", "could not connect", "closed the connection unexpectedly",
                "no such file or directory", "timeout expired", "connection timed out",
                "terminating connection", "server closed the connection")
#: ... and what the server answers a startup packet with while it cannot take a session yet:
#: SQLSTATE 57P03 cannot_connect_now (postmaster.c's canAcceptConnections: starting up,
#: replaying WAL after a crash or as a standby not yet consistent, hot standby off, crashed
#: and reinitializing, shutting down) and 53300 too_many_connections (postinit.c). Not
#: ``database "x" is not currently accepting connections`` (datallowconn false): that stays.
_NOT_YET = ("the database system is starting up",
            "the database system is not yet accepting connections",
            "consistent recovery state has not been yet reached",
            "the database system is not accepting connections",
            "the database system is in recovery mode",
            "the database system is shutting down",
            "sorry, too many clients already",
            "remaining connection slots are reserved",
            "too many connections for role", "too many connections for database")
_TRANSIENT = _UNREACHABLE + _NOT_YET


def transient_refusal(message: str) -> bool:
    """Whether libpq's ``message`` for a failed connection says the server was not reachable
    or not accepting connections yet (rule 4), rather than that it refused the login. Any
    thread."""
    text = message.lower()
    return any(needle in text for needle in _TRANSIENT)


class Secret:
    """A password: never shown, never pickled (rule 2). ``reveal()`` gives it to libpq."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The password itself, for libpq. Called only by :meth:`ConnectionOptions.connect`,
        in the thread that connects."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(Secret)

    def __reduce__(self) -> Any:
        raise TypeError("a password is never pickled (sparkcoord/sources/postgres/io/connection.py "
                        "rule 2): supply it through PGPASSWORD or a passfile where it is needed")


def _libpq_keywords() -> frozenset[str]:
    from psycopg import pq

    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


@dataclass(frozen=True)
class ConnectionOptions:
    """The connection's libpq parameters without secrets (rule 1), and the secrets apart
    (rule 2). Made by :meth:`parse` in the driver program; pickles without secrets."""

    params: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, Secret], ...] = field(default=(), repr=False, compare=False)
    #: set on a copy that was unpickled: secrets were given but not carried over
    secrets_dropped: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def parse(cls, url: str | None = None,
              options: Mapping[str, str] | None = None) -> ConnectionOptions:
        """The options of ``url`` (``postgresql://user@host:port/db?...`` or ``key=value``
        text, or None to take everything from libpq's environment) overridden by
        ``options`` (libpq keywords, or ``database``/``username``). Called by the source's
        builder in the driver program."""
        import psycopg

        merged: dict[str, str] = {}
        if url:
            try:
                merged.update((k, str(v)) for k, v in
                              psycopg.conninfo.conninfo_to_dict(url).items() if v is not None)
            except psycopg.ProgrammingError:
                raise ValueError(f"not a PostgreSQL connection URL or key=value string: "
                                 f"{redacted(url)}") from None
        known = _libpq_keywords()
        for name, value in (options or {}).items():
            keyword = ALIASES.get(name.lower(), name.lower())
            if keyword not in known:
                raise ValueError(f"unknown connection option {name!r}: expected a libpq "
                                 "connection keyword (host, port, dbname or database, user, "
                                 "password, sslmode, connect_timeout, ...)")
            merged[keyword] = str(value)
        params = tuple(sorted((k, str(v)) for k, v in merged.items()
                              if k not in SECRET_KEYWORDS and v is not None))
        secrets = tuple(sorted((k, Secret(str(v))) for k, v in merged.items()
                               if k in SECRET_KEYWORDS and v))
        return cls(params, secrets)

    # rule 2: what is pickled holds no secret
    def __getstate__(self) -> dict[str, Any]:
        return {"params": self.params, "secrets_dropped": self.secrets_dropped or
                bool(self.secrets)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "params", state["params"])
        object.__setattr__(self, "secrets", ())
        object.__setattr__(self, "secrets_dropped", state.get("secrets_dropped", False))

    def get(self, keyword: str) -> str | None:
        return dict(self.params).get(keyword)

    def target(self) -> dict[str, str]:
        """Host, port, database and user as libpq will use them: ours, else libpq's defaults
        (its environment). For messages; never a secret. Any thread."""
        from psycopg import pq

        defaults = {o.keyword.decode(): (o.val or b"").decode()
                    for o in pq.Conninfo.get_defaults()}
        ours = dict(self.params)

        def pick(keyword: str) -> str:
            return ours.get(keyword) or defaults.get(keyword) or ""

        user = pick("user")
        return {"host": pick("host") or "the default unix socket", "port": pick("port"),
                "database": pick("dbname") or user, "user": user}

    def describe(self) -> str:
        """``user@host:port/database`` for log lines and errors (rule 3). Any thread."""
        t = self.target()
        return f"{t['user']}@{t['host']}:{t['port']}/{t['database']}"

    def conninfo(self) -> str:
        """The ``key=value`` string without secrets (safe to show). Any thread."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(**dict(self.params))

    def connect(self, *, autocommit: bool = True, application_name: str = "sparkcoord",
                retry_s: float = 0.0, **extra: Any) -> Any:
        """A psycopg connection with the session settings of rule 5, or a
        :class:`ConnectionRefused` (rule 3), waiting up to ``retry_s`` for a server that is
        not reachable yet (rule 4). Called in the process and thread that will use the
        connection: the enumerator's workers, an executor's task."""
        import random
        import time

        deadline = time.monotonic() + retry_s
        pause = 0.2
        warned = False
        while True:
            try:
                return self._connect_once(autocommit, application_name, extra)
            except ConnectionRefused as e:
                if not e.transient or time.monotonic() + pause > deadline:
                    raise
                if not warned:
                    log.warning("%s; trying again for up to %.0f s", e, retry_s)
                    warned = True
                time.sleep(pause * (0.75 + random.random() / 2))
                pause = min(pause * 2, 5.0)

    def _connect_once(self, autocommit: bool, application_name: str,
                      extra: dict[str, Any]) -> Any:
        import psycopg

        kwargs: dict[str, Any] = dict(self.params)
        kwargs.update((k, s.reveal()) for k, s in self.secrets)
        kwargs["options"] = " ".join(o for o in (kwargs.get("options", ""), SESSION_SETTINGS)
                                     if o)
        kwargs["client_encoding"] = "UTF8"
        kwargs.setdefault("application_name", application_name)
        kwargs.setdefault("connect_timeout", "10")
        kwargs.update(extra)
        log.debug("connecting to PostgreSQL %s", self.describe())
        try:
            return psycopg.connect(autocommit=autocommit, **kwargs)
        except psycopg.OperationalError as e:
            raise self.refused(str(e), transient=transient_refusal(str(e))) from None

    def refused(self, reason: str, transient: bool = False) -> ConnectionRefused:
        """The error for a connection the server refused or could not be made (rule 3). Any
        thread."""
        t = self.target()
        text = self.scrub(reason.strip()).replace("\n", " ").replace("  ", " ")
        message = (f"PostgreSQL at {t['host']} port {t['port']}, database {t['database']!r}, "
                   f"user {t['user']!r}: cannot connect: {text}")
        if self.secrets_dropped and "password" in text.lower():
            message += (" (the password given in the options stays in the driver program and "
                        "is never sent to other processes or checkpoints: supply it here "
                        "through PGPASSWORD or a passfile)")
        return ConnectionRefused(message, transient)

    def scrub(self, text: str) -> str:
        """``text`` with every secret's value replaced by ``***``. Any thread."""
        for _, secret in self.secrets:
            value = secret.reveal()
            if value:
                text = text.replace(value, MASK)
        return redacted(text) if "://" in text or "password" in text else text


_URL_USERINFO = re.compile(r"(postgres(?:ql)?://)([^@/?#\s]*?):([^@/?#\s]*)@", re.IGNORECASE)
_KV_SECRET = re.compile(
    r"((?:ssl)?password)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def redacted(text: str) -> str:
    """``text`` (a URL, a ``key=value`` string, or a message holding either) with every
    password shown as ``***``: a URL's ``user:password@``, a ``password=`` parameter (of a
    URL's query or a key=value string), ``sslpassword=`` too. Any thread."""
    text = _URL_USERINFO.sub(lambda m: f"{m[1]}{m[2]}:{MASK}@", text)
    return _KV_SECRET.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
