"""Server settings and objects around the protected tables: what weakens the lease tokens'
durability, what switches fencing off for ordinary roles (a grant of SET on
session_replication_role, settings that hand out a token), and subscriptions that replicate
into protected tables."""

from __future__ import annotations

from fencekit.catalog.model import Conn, Drift, DriftKind, ProtectedTable
from fencekit.ident import quote_ident

__all__ = [
    "backend_settings",
    "durability_warnings",
    "setting_drift",
    "subscription_warnings",
]

#: The backend's command-line switches that take an argument (postgres.c's getopt string,
#: "B:bC:c:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"); ``c`` and ``-`` set a setting.
_SWITCHES_WITH_ARG = frozenset("BCcDdfhkNprStvW-")


_C_SPACE = " \t\n\r\f\v"  # isspace() in the C locale


def split_options(options: str) -> list[str]:
    """The words of a libpq ``options`` string as the server splits them (``pg_split_opts``):
    at unescaped whitespace, each backslash dropped and the character after it kept as is.
    So ``-c fencekit.tok\\en=9`` is ``-c``, ``fencekit.token=9``."""
    words: list[str] = []
    word: list[str] | None = None
    escaped = False
    for ch in options:
        if word is None:
            if ch in _C_SPACE:
                continue
            word = []
        if not escaped and ch in _C_SPACE:
            words.append("".join(word))
            word = None
        elif not escaped and ch == "\\":
            escaped = True
        else:
            escaped = False
            word.append(ch)
    if word is not None:
        words.append("".join(word))
    return words


def backend_settings(options: str) -> list[tuple[str, str]]:
    """The (name, value) settings a libpq ``options`` string gives the session it opens, the
    way the server reads them: ``-c name=value``, ``-cname=value``, the double-dash long form,
    switches bundled before ``c`` (``-ec name=value``); names are lower-cased and ``-`` is
    ``_``."""
    out: list[tuple[str, str]] = []
    args = split_options(options)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            continue
        j = 1
        while j < len(arg):
            switch = arg[j]
            if switch not in _SWITCHES_WITH_ARG:
                j += 1
                continue
            value = arg[j + 1 :]
            if not value and i < len(args):
                value = args[i]
                i += 1
            if switch in "c-":
                name, _, setting = value.partition("=")
                out.append((name.lower().replace("-", "_"), setting))
            break
    return out


def durability_warnings(conn: Conn) -> list[str]:
    """Why this server could hand out a lease token again after a crash or failover.

    Tokens are durable as committed rows are: lost with fsync off, and on a failover to an
    asynchronous standby that had not received the last grants. ``sync_state`` is visible only
    to superusers and pg_read_all_stats; for other roles every standby looks asynchronous.
    """
    row = conn.execute(
        """SELECT pg_catalog.current_setting('fsync')::boolean,
                  pg_catalog.current_setting('synchronous_commit'),
                  (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication r
                    WHERE r.sync_state IS DISTINCT FROM 'sync'
                      AND r.sync_state IS DISTINCT FROM 'quorum'
                      AND NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots s
                                       WHERE s.active_pid = r.pid AND s.slot_type = 'logical'))"""
    ).fetchone()
    if row is None:
        return []
    fsync, sync_commit, async_standbys = row
    out: list[str] = []
    if not fsync:
        out.append(
            "fsync is off: a crash can lose committed lease grants, and the same token could "
            "be issued twice (fencekit's lease functions cannot protect against that)"
        )
    if async_standbys:
        out.append(
            f"{async_standbys} asynchronous standby(s): a failover to one of them loses the "
            "lease grants and fenced writes it had not received (tokens never repeat: the epoch "
            "rises; zombies are refused by lease-bound fences or a claim at grant); list them "
            "in synchronous_standby_names to lose nothing acknowledged (see docs/ha.md)"
        )
    if sync_commit in ("off", "local") and async_standbys:
        out.append(
            f"synchronous_commit = {sync_commit}: commits do not wait for standbys; fencekit's "
            "lease functions raise it for their own transactions, other writes are not covered"
        )
    return out


def setting_drift(conn: Conn) -> list[Drift]:
    """Server objects that switch fencing off for roles that are not superusers: a grant of
    SET on session_replication_role (PostgreSQL 15+; under ``replica`` no trigger fires), and
    role, database, foreign-server or user-mapping settings that hand sessions a
    fencekit.token (every write of those sessions then presents it)."""
    out: list[Drift] = []
    if conn.execute("SELECT pg_catalog.to_regclass('pg_catalog.pg_parameter_acl')").fetchone() != (
        None,
    ):
        grantees = [
            str(r[0])
            for r in conn.execute(
                "SELECT DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC' "
                "ELSE x.grantee::pg_catalog.regrole::pg_catalog.text END "
                "FROM pg_catalog.pg_parameter_acl a, pg_catalog.aclexplode(a.paracl) x "
                "WHERE a.parname = 'session_replication_role' AND x.privilege_type = 'SET' "
                "AND (x.grantee = 0 OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r "
                "                           WHERE r.oid = x.grantee)) ORDER BY 1"
            ).fetchall()
        ]
        if grantees:
            out.append(
                Drift(
                    DriftKind.REPLICATION_ROLE_GRANTED,
                    "session_replication_role",
                    f"{', '.join(grantees)} may SET session_replication_role: under 'replica' "
                    "no trigger fires, fencekit's checks included, so those roles write "
                    "unchecked and uncounted",
                    "as a superuser: REVOKE SET ON PARAMETER session_replication_role FROM "
                    + ", ".join(grantees),
                    tuple(grantees),
                )
            )
    for where, setting, fix in conn.execute(
        "SELECT CASE WHEN s.setrole = 0 THEN 'database ' || d.datname "
        "       WHEN s.setdatabase = 0 THEN 'role ' || s.setrole::pg_catalog.regrole "
        "       ELSE 'role ' || s.setrole::pg_catalog.regrole || ' in database ' || d.datname "
        "       END, c, "
        "       CASE WHEN s.setrole = 0 THEN 'ALTER DATABASE ' || pg_catalog.quote_ident(d.datname)"
        "       ELSE 'ALTER ROLE ' || s.setrole::pg_catalog.regrole || CASE WHEN s.setdatabase = 0"
        "         THEN '' ELSE ' IN DATABASE ' || pg_catalog.quote_ident(d.datname) END END"
        "       || ' RESET session_replication_role' "
        "FROM pg_catalog.pg_db_role_setting s "
        "LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase, "
        "pg_catalog.unnest(s.setconfig) c "
        "WHERE pg_catalog.lower(pg_catalog.split_part(c, '=', 1)) = 'session_replication_role' "
        "  AND pg_catalog.lower(pg_catalog.btrim(pg_catalog.substr(c, "
        "        pg_catalog.strpos(c, '=') + 1), ' ''\"')) = 'replica' "
        "ORDER BY 1"
    ).fetchall():
        out.append(
            Drift(
                DriftKind.REPLICATION_ROLE_DEFAULT,
                str(where),
                f"{where} has the default setting {setting}: no trigger fires in the sessions "
                "it applies to, fencekit's checks included, so they write unchecked and "
                "uncounted",
                str(fix),
            )
        )
    token = "fencekit.token"
    for where, setting, fix in conn.execute(
        "SELECT CASE WHEN s.setrole = 0 THEN 'database ' || d.datname "
        "       WHEN s.setdatabase = 0 THEN 'role ' || s.setrole::pg_catalog.regrole "
        "       ELSE 'role ' || s.setrole::pg_catalog.regrole || ' in database ' || d.datname "
        "       END, c, "
        "       CASE WHEN s.setrole = 0 THEN 'ALTER DATABASE ' || pg_catalog.quote_ident(d.datname)"
        "       ELSE 'ALTER ROLE ' || s.setrole::pg_catalog.regrole || CASE WHEN s.setdatabase = 0"
        "         THEN '' ELSE ' IN DATABASE ' || pg_catalog.quote_ident(d.datname) END END"
        "       || ' RESET fencekit.token' "
        "FROM pg_catalog.pg_db_role_setting s "
        "LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase, "
        "pg_catalog.unnest(s.setconfig) c "
        "WHERE pg_catalog.lower(c) LIKE 'fencekit.token=%%' ORDER BY 1"
    ).fetchall():
        out.append(
            Drift(
                DriftKind.TOKEN_SETTING,
                str(where),
                f"{where} has the default setting {setting}: every session it applies to "
                "presents that token without asking the issuer, stale or not",
                str(fix),
            )
        )
    for kind, name, options, fix in conn.execute(
        "SELECT 'foreign server', s.srvname, s.srvoptions, "
        "       'ALTER SERVER ' || pg_catalog.quote_ident(s.srvname) "
        "       || ' OPTIONS (SET options '''')' "
        "  FROM pg_catalog.pg_foreign_server s "
        "UNION ALL "
        "SELECT 'user mapping', u.usename || ' on server ' || u.srvname, u.umoptions, "
        "       'ALTER USER MAPPING FOR ' || pg_catalog.quote_ident(u.usename) || ' SERVER ' "
        "       || pg_catalog.quote_ident(u.srvname) || ' OPTIONS (DROP options)' "
        "  FROM pg_catalog.pg_user_mappings u ORDER BY 1, 2"
    ).fetchall():
        bad = [str(o) for o in (options or []) if _hands_out(str(o))]
        if bad:
            out.append(
                Drift(
                    DriftKind.TOKEN_SETTING,
                    f"{kind} {name}",
                    f"{kind} {name} sets {token} or session_replication_role = replica "
                    f"({'; '.join(bad)}): every session it opens (postgres_fdw, dblink) "
                    "presents that token, stale or not, or fires no trigger at all",
                    f"remove the setting from its options ({fix}, keeping any other setting)",
                )
            )
    return out


def _hands_out(option: str) -> bool:
    """Whether a foreign server's or user mapping's option (``key=value``) gives the sessions
    it opens a fencekit.token, or session_replication_role = replica, however spelled."""
    key, _, value = option.partition("=")
    if key.strip().lower() != "options":
        return "fencekit.token" in option.lower()  # another wrapper's own way to pass it
    return any(
        name == "fencekit.token"
        or (name == "session_replication_role" and value_.strip("'\" ").lower() == "replica")
        for name, value_ in backend_settings(value)
    )


def subscription_warnings(conn: Conn, tables: list[ProtectedTable]) -> list[str]:
    """Subscriptions that replicate into protected tables or fencekit's fences: the apply
    worker writes under session_replication_role = replica (no check fires), and replicated
    fence rows overwrite this server's, lowering fences a local writer advanced."""
    names = [(pt.spec.table.schema, pt.spec.table.name) for pt in tables]
    names += [("fencekit", "fences"), ("fencekit", "leases")]
    rows = conn.execute(
        "SELECT s.subname, n.nspname, c.relname FROM pg_catalog.pg_subscription_rel r "
        "JOIN pg_catalog.pg_subscription s ON s.oid = r.srsubid "
        "JOIN pg_catalog.pg_class c ON c.oid = r.srrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE s.subdbid = (SELECT oid FROM pg_catalog.pg_database "
        "                    WHERE datname = pg_catalog.current_database()) ORDER BY 1, 2, 3"
    ).fetchall()
    found: dict[str, list[str]] = {}
    for sub, schema, name in rows:
        if (schema, name) in names:
            found.setdefault(str(sub), []).append(f"{quote_ident(schema)}.{quote_ident(name)}")
    return [
        f"subscription {sub} replicates into {', '.join(rels)}: its apply worker writes with no "
        "check firing, and replicated fence rows replace this server's (lowering fences local "
        "writers advanced); take no local writes on those tables here (see docs/security.md)"
        for sub, rels in found.items()
    ]
