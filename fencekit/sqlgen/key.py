"""Key fences: rows that share key values share one fence in ``fencekit.fences``.

Set-based, once per statement: an AFTER STATEMENT trigger reads the distinct keys the statement
wrote from its transition tables (only the trigger can: they are visible nowhere else) and hands
them to ``fencekit.judge_fences`` (45_judge.sql). A key whose fence already holds the token (the
holder writing again, the common case) is share-locked (``FOR SHARE``) and passes: writers under
the same token never wait for each other, while an advance to a higher token (an exclusive row
lock) waits until they commit, so no write under a lower token commits after a higher token
advanced the fence.

There is no statement check before INSERT, UPDATE or DELETE (only before TRUNCATE): everything
is judged here, once, by the token read at the end of the statement.

The functions run as the role that ran protect (they write ``fencekit.fences``, which writers may
not) with pinned settings: a key's identity is its text under TimeZone=UTC, ISO dates and hex
bytea, so two sessions with other settings always name the same key the same way. Protect
refuses key types whose equal values can print differently (``fencekit.check_key_columns``).

The common case reads the keys in one statement that names nothing of the owner's whatever
the key columns' types are now (_lookup): each key is printed by ``pg_catalog.concat``,
which runs only the type's output function (built-in code for every type a role that is not
a superuser can create: no cast is looked up), and its columns are named unqualified, so a
name that is no column any more is a marker of the statement's own (never a function of the
row, as ``x.to_json`` is ``to_json(x)``). The same statement tests the key columns' types,
as the plan has them (PostgreSQL plans it again after any change to the table): keys of a
few built-in types (_FAST_TYPES) print alike under any settings and are judged at once;
anything else takes the slow path, whose full check (_check_types) proves from the catalogs
that each key column is live, of a type whose text is built-in code and of the family protect
recorded, before the keys are cast to text under pinned settings.
"""

from __future__ import annotations

from dataclasses import replace

from fencekit.ident import quote_ident
from fencekit.sqlgen.common import Names, attribute, definer_function, judge_fences, statement_token
from fencekit.sqlgen.crossing import crossing_triggers
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.text import TOKEN, comment, lit, token_fast

__all__ = ["KEY_SETTINGS", "key_expression", "key_objects"]

#: Settings that decide how the allowed key types print: TimeZone (timestamptz), DateStyle
#: (date, timestamp, timestamptz) and bytea_output (bytea). IntervalStyle and
#: extra_float_digits change how no allowed key type prints (interval and floating point are
#: refused, fencekit.key_family). The key triggers set them only while they print the keys of
#: a table whose key families may print by them (_UNPRINTED); a pin in the SET clause
#: would cost a save and a restore of each on every statement, integer keys included.
KEY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("timezone", "'UTC'"),
    ("datestyle", "'ISO, YMD'"),
    ("bytea_output", "'hex'"),
)

#: The key families (fencekit.key_family's names, or their beginnings) whose text depends on
#: no setting; keys of any other family (date, time, timestamp, timestamptz, bytea) are printed
#: under KEY_SETTINGS, and so is anything not named here.
_UNPRINTED = ("integer", "text", "character", "uuid", "boolean")
_UNPRINTED_PREFIXES = ("character varying(", "numeric scale ")

# The key families of built-in types, by type OID, as fencekit.key_family names them (a test
# keeps the two equal): the generated triggers' fast check of the key columns' types.
_FAMILY_OIDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("'integer'", (20, 21, 23)),  # bigint, smallint, integer
    ("'text'", (25,)),
    # varchar: with its length (storing trims trailing spaces beyond it), unbounded as text
    (
        "CASE WHEN {a}.atttypmod OPERATOR(pg_catalog.<) 0 THEN 'text'\n"
        "                      ELSE pg_catalog.format_type({a}.atttypid, {a}.atttypmod) END",
        (1043,),
    ),
    ("'character'", (1042,)),  # char(n): its text drops trailing spaces
    # uuid, boolean, date, bytea: named by their type
    ("pg_catalog.format_type({a}.atttypid, NULL)", (2950, 16, 1082, 17)),
    # time, timestamp, timestamptz: with their precision (6, the most, is an unbounded one's)
    (
        "pg_catalog.format_type({a}.atttypid, NULLIF({a}.atttypmod, 6))",
        (1083, 1114, 1184),
    ),
)
# Collations whose equal strings are equal bytes: none, default, "C", "POSIX".
_PLAIN_COLLATIONS = (0, 100, 950, 951)

#: The key column types of the fast path: built in, printed by output functions of their own
#: that read no setting, and of a family named by the type alone: bigint, smallint, integer,
#: text, uuid. (Their text is the same through concat as through a cast to text.)
_FAST_TYPES = (20, 21, 23, 25, 2950)


def _live(a: str, column: str) -> str:
    """SQL: ``a`` (a pg_attribute row) is the live column ``column`` of the trigger's table."""
    eq = "OPERATOR(pg_catalog.=)"
    return (
        f"{a}.attrelid {eq} TG_RELID AND {a}.attname {eq} {lit(column)}\n"
        f"       AND {a}.attnum OPERATOR(pg_catalog.>) 0 AND NOT {a}.attisdropped"
    )


def key_expression(columns: tuple[str, ...], alias: str | None) -> str:
    """A key's identity as text: one column's text, or a record of the columns' texts (so
    integer and text columns of different widths name a shared resource's keys alike). NULL
    when a key column is (key columns must be NOT NULL; fencekit.judge_fences refuses a NULL
    key): a record would print a NULL part as nothing, a key of its own. A stored generated
    column reads NULL in the transition table of an INSERT that a partitioned table routed to a
    partition whose columns lie otherwise (PostgreSQL fills it in only later). ``alias``
    None: the columns named unqualified (the key triggers, beside _markers: a name that is no
    column is then never read as a function of the row)."""
    refs = [quote_ident(c) if alias is None else f"{alias}.{quote_ident(c)}" for c in columns]
    if len(refs) == 1:
        return f"{refs[0]}::pg_catalog.text"
    i = " " * 28
    known = f"\n{i}  AND ".join(f"{r} IS NOT NULL" for r in refs)
    texts = f",\n{i}       ".join(f"{r}::pg_catalog.text" for r in refs)
    return f"CASE WHEN {known}\n{i}THEN ROW({texts})::pg_catalog.text END"


def _token_fast(n: Names) -> str:
    """SQL: the common case of the statement's token, one condition on the value read once into
    ``raw``: canonical (no sign, space or leading zero) and below 10^18, no bypass asked for,
    and the right issuer (the token's form: text.token_fast). Anything else is judged by
    ``fencekit.statement_token`` (_slow_token), which reads the token itself and says what is
    wrong."""
    issuer = ""
    if n.spec.issuer is not None:
        issuer = (
            "\n             AND (COALESCE(pg_catalog.current_setting('fencekit.issuer', true), '')"
            " OPERATOR(pg_catalog.=) ''\n"
            "                  OR pg_catalog.current_setting('fencekit.issuer', true) "
            f"OPERATOR(pg_catalog.=) {lit(n.spec.issuer)})"
        )
    return (
        f"{token_fast('raw', indent='             ')}\n"
        "             AND COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        f"OPERATOR(pg_catalog.=) ''{issuer}"
    )


def _slow_token(n: Names, *, counted: bool) -> str:
    """PL/pgSQL: ``tok`` judged by ``fencekit.statement_token`` when the common case did not
    settle it (``counted``: a write let through without a token is counted here, not by a row
    check of crossing rows: the statement's own trigger counts it); the write goes on
    unjudged when it returns NULL (bypassed, or allowed without a token: attributed in
    rollout mode)."""
    return (
        "    IF tok IS NULL THEN\n"
        f"      tok := {statement_token(n, counted=None if counted else 'false')};\n"
        "    END IF;\n"
        "    IF tok IS NULL THEN\n"
        + (attribute(n, "      ", otherwise=False) if counted else "")
        + "      RETURN NULL;\n"
        "    END IF;\n"
    )


def _oids(oids: tuple[int, ...]) -> str:
    return f"'{{{','.join(map(str, oids))}}}'::pg_catalog.oid[]"


def _family(a: str) -> str:
    """SQL: the family of the key column read as ``a`` (a pg_attribute row) now; NULL when the
    fast check cannot name it (a domain, another collation, a type that is no key type)."""
    eq = "OPERATOR(pg_catalog.=)"
    whens = "".join(
        f"\n               WHEN {a}.atttypid {eq} ANY ({_oids(oids)})\n"
        f"                 THEN {family.format(a=a)}"
        for family, oids in _FAMILY_OIDS
    )
    return (
        f"CASE WHEN {a}.attgenerated {eq} 'v'\n"
        f"                 OR NOT {a}.attcollation {eq} ANY ({_oids(_PLAIN_COLLATIONS)}) THEN NULL"
        f"{whens}\n"
        f"               WHEN {a}.atttypid {eq} 1700::pg_catalog.oid "
        f"AND {a}.atttypmod OPERATOR(pg_catalog.>=) 4\n"
        f"                 THEN 'numeric scale ' OPERATOR(pg_catalog.||) (({a}.atttypmod "
        "OPERATOR(pg_catalog.-) 4)\n"
        "                      OPERATOR(pg_catalog.&) 65535)::pg_catalog.text END"
    )


def _check_types(n: Names, sources: list[str]) -> str:
    """PL/pgSQL: refuse unless the key columns' types still name keys as they did at protect.
    The common case, every key column of a built-in type of the family protect recorded, is
    one catalog read here (index lookups, no call, no settings saved); anything else (a domain,
    a change, a column gone) goes to fencekit.check_key_types (32_key_types.sql), which says
    what is wrong or finds nothing is. ``printed``: whether the keys print by KEY_SETTINGS
    (from the families protect recorded; NULL, and so pinned, when the read found no row).

    That read sees the catalogs as of the statement's snapshot, which in a REPEATABLE READ or
    SERIALIZABLE transaction may predate the owner's last change to the table, while PostgreSQL
    plans the statement that casts the keys against the catalogs as they are now. So the types
    the read approved (``types``) must be the ones a statement planned now finds (_planned):
    else the write is refused before that statement is planned."""
    eq = "OPERATOR(pg_catalog.=)"
    cols = [(f"a{i}", c) for i, c in enumerate(n.spec.key, 1)]
    families = ",\n          ".join(_family(a) for a, _ in cols)
    attrs = "".join(f", pg_catalog.pg_attribute {a}" for a, _ in cols)
    where = "".join(f"\n       AND {_live(a, c)}" for a, c in cols)
    unprinted = ", ".join(lit(f) for f in _UNPRINTED)
    prefixes = "".join(
        f"\n                                   OR u.f OPERATOR(pg_catalog.~~) {lit(p + '%')}"
        for p in _UNPRINTED_PREFIXES
    )
    return (
        "    SELECT pr.key_families OPERATOR(pg_catalog.=) ARRAY[\n"
        f"          {families}],\n"
        "           pr.key_families IS NULL\n"
        "             OR EXISTS (SELECT FROM pg_catalog.unnest(pr.key_families) AS u(f)\n"
        "                         WHERE NOT (u.f OPERATOR(pg_catalog.=)\n"
        f"                                      ANY (ARRAY[{unprinted}])"
        f"{prefixes})),\n"
        f"           ARRAY[{', '.join(f'{a}.atttypid' for a, _ in cols)}]\n"
        "      INTO typed, printed, types\n"
        f"      FROM fencekit.protected pr{attrs}\n"
        f"     WHERE pr.tag {eq} {n.lit_tag}{where};\n"
        "    IF NOT COALESCE(typed, false) THEN\n"
        f"      PERFORM fencekit.check_key_types({n.lit_tag}, TG_RELID::pg_catalog.regclass);\n"
        "    END IF;\n" + _planned(n, sources)
    )


def _planned(n: Names, sources: list[str]) -> str:
    """PL/pgSQL: refuse unless the key columns' types as a statement planned now finds them are
    ``types``, those the catalog check approved. The statement names each key column
    unqualified (a name that is no column reads the marker, a boolean) and only inside
    ``pg_typeof``, which evaluates nothing of the column's type: a scalar subquery's type is
    the column's, rows or none."""
    typed = ",\n             ".join(
        f"pg_catalog.pg_typeof((SELECT {quote_ident(c)}\n"
        f"          FROM {sources[0]} AS fencekit_y\n"
        "         LIMIT 1))::pg_catalog.oid"
        for c in n.spec.key
    )
    return (
        f"    SELECT ARRAY[{typed}]\n"
        "      INTO planned\n"
        f"      FROM {_markers(n)};\n"
        "    IF planned IS DISTINCT FROM types THEN\n"
        "      RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        "        MESSAGE = pg_catalog.format('fencekit: the key columns of %s changed after '\n"
        "          'this transaction''s snapshot was taken: its writes cannot name their keys',\n"
        "          TG_RELID::pg_catalog.regclass),\n"
        "        HINT = 'Retry the transaction.';\n"
        "    END IF;\n"
    )


def _fast_text(columns: tuple[str, ...]) -> str:
    """SQL: a key's identity as text, as key_expression names it, for a row whose key columns
    are all of _FAST_TYPES (their output function prints what their cast to text does); NULL
    for any other row (a NULL part, a column of another type: the slow path's to judge). Nothing
    of the owner's is looked up whatever the columns' types are: each column is named
    unqualified (a name that is no column of the row is the statement's marker, _markers),
    tested by ``pg_typeof`` (the type the plan has, planned again after the table changes) and
    printed by ``concat`` (its type's output function, no cast), in the default collation (none
    of the column's is used)."""
    eq = "OPERATOR(pg_catalog.=)"
    cols = [quote_ident(c) for c in columns]
    i = " " * 28
    # NOT NULL first: concat prints a NULL as nothing.
    known = f"\n{i}  AND ".join(
        [f"{c} IS NOT NULL" for c in cols]
        + [
            f"pg_catalog.pg_typeof({c})::pg_catalog.oid\n{i}      {eq} ANY ({_oids(_FAST_TYPES)})"
            for c in cols
        ]
    )
    texts = [f'pg_catalog.concat({c}) COLLATE pg_catalog."default"' for c in cols]
    if len(cols) == 1:
        return f"CASE WHEN {known}\n{i}THEN {texts[0]} END"
    row = f",\n{i}       ".join(texts)
    return f"CASE WHEN {known}\n{i}THEN ROW({row})::pg_catalog.text END"


def _markers(n: Names) -> str:
    """SQL: a FROM item with one NULL per key column, named like it: a key name that is no
    column of the statement's rows any more reads this (SQL looks in the outer query for a
    name the inner one lacks, before PL/pgSQL's variables). Of type pg_lsn, which no key column
    can have (fencekit.key_family refuses it): no fast type, and never a type the full check
    approved (_planned)."""
    nulls = ", ".join("NULL::pg_catalog.pg_lsn" for _ in n.spec.key)
    names = ", ".join(quote_ident(c) for c in n.spec.key)
    return f"(VALUES ({nulls}))\n                AS fencekit_m({names})"


#: SQL: ``ok`` from the keys the fast path printed: every row's, none NULL (a NULL part, a key
#: column of another type).
_ALL_PRINTED = "pg_catalog.array_position(k.ks, NULL::pg_catalog.text) IS NULL"


def _printing(body: str) -> str:
    """PL/pgSQL: ``body`` (which prints the keys) under KEY_SETTINGS when the keys print by them
    (``printed`` not false), each set for the transaction and set back to the caller's value
    after: the same text whatever the writer's session set. An error in between ends the
    statement, and its (sub)transaction's settings with it."""
    names = [name for name, _ in KEY_SETTINGS]
    saved = ",\n                     ".join(
        f"pg_catalog.current_setting({lit(name)})" for name in names
    )
    pin = ",\n              ".join(
        f"pg_catalog.set_config({lit(name)}, {value}, true)" for name, value in KEY_SETTINGS
    )
    back = ",\n              ".join(
        f"pg_catalog.set_config({lit(name)}, pins[{i}], true)" for i, name in enumerate(names, 1)
    )
    return (
        "    IF printed IS NOT FALSE THEN\n"
        f"      pins := ARRAY[{saved}];\n"
        f"      PERFORM {pin};\n"
        "    END IF;\n" + body + "    IF printed IS NOT FALSE THEN\n"
        f"      PERFORM {back};\n"
        "    END IF;\n"
    )


def _every_key(sources: list[str], expr: str) -> str:
    """SQL: ``expr`` (a key's text) for every row the statement wrote, in no order and with
    repeats: no sort for the common case (a one-row write has one key, or an UPDATE's old and
    new the same one); _one_key sorts them when there are several."""
    union = "\n              UNION ALL ".join(
        f"SELECT {expr}\n                FROM {s} AS fencekit_y" for s in sources
    )
    return f"ARRAY({union})"


def _distinct_keys(n: Names, sources: list[str], expr: str) -> str:
    """SQL: the statement's distinct keys (``expr``), sorted: every lock a key fence takes is
    taken in key order, so two writers never deadlock on fences."""
    cols = ", ".join(quote_ident(c) for c in n.spec.key)
    union = "\n                         UNION ALL ".join(
        f"SELECT {cols}\n                           FROM {s} AS fencekit_y" for s in sources
    )
    return (
        f"ARRAY(SELECT DISTINCT {expr}\n"
        f"                   FROM ({union}) AS fencekit_x\n"
        "                  ORDER BY 1)"
    )


def _keys(n: Names, sources: list[str], *, fast: bool) -> str:
    """PL/pgSQL: a lease-bound fence's keys: ``ks``, the statement's distinct keys, sorted.
    ``fast``: printed by _fast_text, with ``ok`` (_ALL_PRINTED); else by key_expression, under
    the settings _printing pins. Key columns named unqualified beside _markers."""
    expr = _fast_text(n.spec.key) if fast else key_expression(n.spec.key, None)
    ok, into = (f", {_ALL_PRINTED}", "ks, ok") if fast else ("", "ks")
    return (
        f"    SELECT k.ks{ok}\n"
        f"      INTO {into}\n"
        f"      FROM (SELECT {_distinct_keys(n, sources, expr)} AS ks\n"
        f"              FROM {_markers(n)}\n"
        "            OFFSET 0) AS k;\n"
    )


def _lookup(n: Names, sources: list[str], *, fast: bool) -> str:
    """PL/pgSQL: one statement: ``ks``, the key of every row written; and ``held``: true when
    they are all one key (none NULL) whose fence holds the token, share-locked (writers under
    one token never wait for each other). ``fast``: the keys printed by _fast_text, ``ok``
    (_ALL_PRINTED) too, the fence compared with the token's common form (``raw``), and the
    holder returns at once; else printed by key_expression and compared with ``tok``."""
    eq = "OPERATOR(pg_catalog.=)"
    mine = ""
    if n.spec.on_equal == "reject":
        mine = f"\n               AND f.writer_xact {eq} pg_catalog.pg_current_xact_id()"
    expr = _fast_text(n.spec.key) if fast else key_expression(n.spec.key, None)
    ok, into = (f", {_ALL_PRINTED}", "ks, ok, held") if fast else ("", "ks, held")
    token = "raw::pg_catalog.int8" if fast else "tok"
    held = (
        "    IF held THEN\n"
        "      RETURN NULL;  -- the key's fence holds the token, and is share-locked\n"
        "    END IF;\n"
    )
    # No variable is named where a key column is in scope. OFFSET 0: the keys are computed
    # once, not once per reference. COLLATE: a key column's own collation ("C") would otherwise
    # meet fencekit.fences' in the comparison. A scalar subquery, not EXISTS: the planner costs
    # EXISTS for its first row and picks a scan of every fence of every resource over the
    # primary key's index. No row (NULL) when the statement wrote no row, a NULL key or
    # several keys.
    return (
        f"    SELECT k.ks{ok},\n"
        "           (SELECT true FROM fencekit.fences f\n"
        f"             WHERE f.resource {eq} {n.resource}\n"
        f'               AND f.key {eq} (k.ks[1] COLLATE pg_catalog."default")\n'
        f'               AND f.key {eq} ALL (k.ks COLLATE pg_catalog."default")\n'
        f"               AND f.fence {eq} {token}{mine}\n"
        "               FOR SHARE)\n"
        f"      INTO {into}\n"
        "      FROM (SELECT\n"
        f"        {_every_key(sources, expr)} AS ks\n"
        f"              FROM {_markers(n)}\n"
        "            OFFSET 0) AS k;\n" + (held if fast else "")
    )


def _one_key(n: Names) -> str:
    """PL/pgSQL: a statement whose rows share one key is judged here, with no call: its fence
    held the token (``held``), or a new token raises it (an UPDATE of its fence; for a key
    with no fence yet, judge_fences' upsert, in this function). Anything else (stale, reused,
    several keys) goes to fencekit.judge_fences, with the keys sorted and each once (every lock
    a key fence takes is taken in key order, so two writers never deadlock on fences)."""
    eq = "OPERATOR(pg_catalog.=)"
    return (
        "  IF held THEN\n"
        "    RETURN NULL;  -- the key's fence holds the token, and is share-locked\n"
        "  ELSIF ks[1] IS NOT NULL AND ks[1] OPERATOR(pg_catalog.=) ALL (ks) THEN\n"
        "    ks := ks[1:1];  -- one key\n"
        "    -- A fence below the token: raised by a plain UPDATE (no speculative insertion).\n"
        "    UPDATE fencekit.fences f\n"
        "       SET fence = tok, writer_xact = pg_catalog.pg_current_xact_id(),\n"
        "           updated_at = pg_catalog.now()\n"
        f"     WHERE f.resource {eq} {n.resource}\n"
        f"       AND f.key {eq} ks[1] AND f.fence OPERATOR(pg_catalog.<) tok\n"
        "    RETURNING true INTO held;\n"
        "    IF held THEN\n"
        "      RETURN NULL;  -- raised to the token by this write, and exclusively locked\n"
        "    END IF;\n"
        "    -- A key without a fence starts at the resource's floor (35_floors.sql).\n"
        "    INSERT INTO fencekit.fences AS f (resource, key, fence, writer_xact)\n"
        f"    VALUES ({n.resource}, ks[1],\n"
        "            GREATEST(tok, (SELECT fl.floor FROM fencekit.floors fl\n"
        f"                            WHERE fl.resource {eq} {n.resource})),\n"
        "            pg_catalog.pg_current_xact_id())\n"
        "    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE\n"
        "       SET fence = tok, writer_xact = excluded.writer_xact,\n"
        "           updated_at = pg_catalog.now()\n"
        "     WHERE f.fence OPERATOR(pg_catalog.<) tok\n"
        f"    RETURNING f.fence {eq} tok INTO held;\n"
        "    IF held THEN\n"
        "      RETURN NULL;  -- raised to the token by this write, and exclusively locked\n"
        "    END IF;\n"
        "    -- Stale, reused, or a concurrent writer raised it first: judge_fences says which.\n"
        "  ELSE\n"
        "    ks := ARRAY(SELECT DISTINCT u.k FROM pg_catalog.unnest(ks) AS u(k) ORDER BY 1);\n"
        "  END IF;\n"
    )


def _body(n: Names, sources: list[str], *, row: bool = False) -> str:
    """The key function over ``sources`` (the statement's transition tables). ``row``: the row
    check of a row that crossed partitions (crossing.py), whose one source is the row: it
    neither counts nor attributes a write without a token, which the statement's own key
    trigger does.

    The common case is one expression, the token's (_token_fast), and one statement, the keys
    printed by their output functions with their types tested and their fence share-locked
    (_lookup); keys of the fast types print alike under any settings, so nothing is
    pinned. Anything else takes the slow path: the token judged by fencekit.statement_token,
    the full check of the key columns, and the keys cast to text under KEY_SETTINGS where
    their families print by them. ``#variable_conflict use_column``: the fast path names key
    columns unqualified, and a key column may be named like a variable.
    Lease-bound fences judge every statement in fencekit.judge_fences (no ``held``)."""
    spec = n.spec
    key_cols = ", ".join(quote_ident(c) for c in spec.key)
    label = spec.key[0] if len(spec.key) == 1 else f"({', '.join(spec.key)})"
    held = "" if spec.lease_bound else "  held pg_catalog.bool;\n"
    what = "-- The key of one row that crossed partitions (MERGE shows it to no UPDATE trigger).\n"
    if spec.lease_bound:
        fast, full = _keys(n, sources, fast=True), _printing(_keys(n, sources, fast=False))
        tail = ""
    else:
        fast, full = _lookup(n, sources, fast=True), _printing(_lookup(n, sources, fast=False))
        tail = _one_key(n)
    return (
        n.title(f"key fence ({comment(key_cols)}), resource {comment(n.resource)}")
        + (what if row else "")
        + "#variable_conflict use_column\n"
        + f"DECLARE\n  raw pg_catalog.text := {TOKEN};  -- read once\n"
        "  tok pg_catalog.int8;\n  ks pg_catalog.text[];\n  ok pg_catalog.bool;\n"
        "  typed pg_catalog.bool;\n  printed pg_catalog.bool;\n"
        "  pins pg_catalog.text[];\n"
        "  types pg_catalog.oid[];\n  planned pg_catalog.oid[];\n"
        + held
        + "BEGIN\n"
        + f"  IF {_token_fast(n)} THEN\n"
        + fast
        + "    tok := raw::pg_catalog.int8;\n"
        + "  END IF;\n"
        + "  IF ok IS NOT TRUE THEN  -- keys of other types, or a token judged in full\n"
        + _slow_token(n, counted=not row)
        # Not indented further: a quoted key column name may hold a line break.
        + _check_types(n, sources)
        + full
        + "  END IF;\n"
        + tail
        + judge_fences(n, "ks", label, indent="  ")
        + "  RETURN NULL;\nEND\n"
    )


def _row_function(n: Names, suffix: str, record: str) -> Function:
    """The key function of one row, ``record`` (OLD or NEW of a row trigger): judges the row's
    key as the statement function judges a statement's. Its key columns are named only after
    the check, as fields of the record (PL/pgSQL reads ``OLD.k`` as a field or fails: never
    as a function of the row)."""
    cols = ", ".join(f"{record}.{quote_ident(c)} AS {quote_ident(c)}" for c in n.spec.key)
    body = _body(n, [f"(SELECT {cols})"], row=True)
    function = definer_function(n.function, suffix, body, _PLAN_SETTINGS)
    return replace(function, partitioned_only=True)


#: The key functions' plans are cached from their first statements, when fencekit.fences may
#: hold few rows: a plan that scans every fence would outlive its growth (until the next
#: ANALYZE). Its primary key's index is the only way they read it.
_PLAN_SETTINGS: tuple[tuple[str, str], ...] = (("enable_seqscan", "off"),)


def key_objects(n: Names, never: Function) -> tuple[list[Function], list[Trigger]]:
    """The key functions and triggers; ``never``: a function for triggers that never run it
    (crossing.py's)."""

    def fn(suffix: str, sources: list[str]) -> Function:
        return definer_function(n.function, suffix, _body(n, sources), _PLAN_SETTINGS)

    ins = fn("ins", ["fencekit_new"])
    upd = fn("upd", ["fencekit_new", "fencekit_old"])
    dele = fn("del", ["fencekit_old"])
    cross_out = _row_function(n, "cross_out", "OLD")
    cross_in = _row_function(n, "cross_in", "NEW")
    return [ins, upd, dele, cross_out, cross_in], [
        Trigger(
            n.trigger("ins"),
            "AFTER INSERT",
            "STATEMENT",
            ins,
            referencing="NEW TABLE AS fencekit_new",
        ),
        Trigger(
            n.trigger("upd"),
            "AFTER UPDATE",
            "STATEMENT",
            upd,
            referencing="OLD TABLE AS fencekit_old NEW TABLE AS fencekit_new",
        ),
        Trigger(
            n.trigger("del"),
            "AFTER DELETE",
            "STATEMENT",
            dele,
            referencing="OLD TABLE AS fencekit_old",
        ),
        keys_guard(n, never),
        *crossing_triggers(n, cross_out, cross_in, never),
    ]


def keys_guard(n: Names, never: Function) -> Trigger:
    """A trigger that keeps the key columns' values from changing under DDL.

    ``ALTER COLUMN ... TYPE`` rewrites the table, each value through its ``USING`` expression,
    without any DML trigger: to the column's own type, it moves rows onto other keys, whose
    fences do not hold the token, and no type check notices. PostgreSQL refuses to retype a
    column that a trigger's ``UPDATE OF`` list names (it records the dependency), and
    ``DROP COLUMN`` then needs CASCADE. The trigger never runs ``never``: its WHEN is constant
    false, and PostgreSQL evaluates it only for an UPDATE that sets a key column, once per
    statement. (A generated key column's ``SET EXPRESSION``, PostgreSQL 17+, is not refused by
    it: status compares the expressions with those protect recorded.)"""
    return Trigger(
        n.trigger("keys"), "AFTER UPDATE", "STATEMENT", never, when="false", columns=n.spec.key
    )
