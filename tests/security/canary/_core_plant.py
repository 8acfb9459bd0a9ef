# ruff: noqa: E501  (planted SQL reads best one statement a line)
"""The canary matrix's planters for schema ``fencekit`` itself (docs/dev/code-paths.md, rows
planted on ``core``): what a table owner with CREATE on the database makes before the first
install, or after ``fencekit uninstall`` dropped the schema.

Each variant is a database where fencekit is not installed (or not as fencekit made it), and
where every entry point that installs, upgrades or reads the core must refuse, change nothing
and run none of the owner's code. The owner's helpers live in its own schema ``own``; every
canary is ``canary_log.hit(label)`` (see :mod:`._plant`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fencekit import sqlgen

#: The owner's helpers, in a schema of its own.
OWN = """
CREATE SCHEMA own;
GRANT USAGE ON SCHEMA own TO PUBLIC;
CREATE FUNCTION own.cint(label text) RETURNS int LANGUAGE plpgsql VOLATILE AS $$
BEGIN PERFORM canary_log.hit(label); RETURN 0; END $$;
CREATE FUNCTION own.imm(label text) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN PERFORM canary_log.hit(label); RETURN 0; END $$;
CREATE FUNCTION own.immb(label text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN RETURN canary_log.hit(label); END $$;
CREATE FUNCTION own.trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM canary_log.hit(TG_ARGV[0]);
  IF TG_LEVEL = 'ROW' THEN
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
  END IF;
  RETURN NULL;
END $$;
"""


def tables_sql(label: str, owner: str) -> str:
    """fencekit.meta with every table-attached planter, seeded as an install would leave it
    (so a command that reads it believes the core is there)."""
    return f"""
CREATE TABLE fencekit.meta (
  key text PRIMARY KEY,
  value text NOT NULL,
  c_default int DEFAULT own.cint('{label}'),
  CONSTRAINT canary_check CHECK (canary_log.hit('{label}'))
);
CREATE INDEX meta_expr ON fencekit.meta ((pg_catalog.length(key) + own.imm('{label}')));
CREATE INDEX meta_partial ON fencekit.meta (value) WHERE own.immb('{label}');
CREATE STATISTICS fencekit.meta_st ON (pg_catalog.length(value) + own.imm('{label}')) FROM fencekit.meta;
CREATE TABLE own.meta_child (CHECK (pg_catalog.length(key) > own.imm('{label}') - 1000000)) INHERITS (fencekit.meta);
INSERT INTO fencekit.meta (key, value) VALUES ('core_version', '{sqlgen.CORE_VERSION}'), ('owner', '{owner}');
GRANT SELECT, INSERT, UPDATE, DELETE ON fencekit.meta TO PUBLIC;
"""


def attached_sql(label: str) -> str:
    """Triggers, a rule and a policy on fencekit.meta: what the install guard names."""
    return f"""
CREATE TRIGGER canary_row BEFORE INSERT OR UPDATE OR DELETE ON fencekit.meta
  FOR EACH ROW EXECUTE FUNCTION own.trg('{label}');
CREATE TRIGGER canary_stmt AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fencekit.meta
  FOR EACH STATEMENT EXECUTE FUNCTION own.trg('{label}');
CREATE RULE canary_rule AS ON UPDATE TO fencekit.meta DO ALSO SELECT canary_log.hit('{label}');
ALTER TABLE fencekit.meta ENABLE ROW LEVEL SECURITY;
CREATE POLICY canary_policy ON fencekit.meta USING (canary_log.hit('{label}'))
  WITH CHECK (canary_log.hit('{label}'));
"""


def views_sql(label: str) -> str:
    """Views under the names of fencekit's tables that commands read."""
    return f"""
CREATE VIEW fencekit.protected AS
  SELECT 'app'::text AS schema_name, 't'::text AS table_name, 'canary'::text AS tag,
         'row'::text AS scope, NULL::text AS resource, '{{}}'::jsonb AS spec,
         1 AS template_version, pg_catalog.now() AS protected_at, NULL::text[] AS key_families
   WHERE canary_log.hit('{label}');
CREATE VIEW fencekit.fences AS
  SELECT 'r'::text AS resource, ''::text AS key, 1::bigint AS fence, NULL::xid8 AS writer_xact,
         pg_catalog.now() AS updated_at WHERE canary_log.hit('{label}');
CREATE VIEW fencekit.resources AS
  SELECT 'r'::text AS resource, NULL::text AS issuer WHERE canary_log.hit('{label}');
GRANT SELECT ON fencekit.protected, fencekit.fences, fencekit.resources TO PUBLIC;
"""


def functions_sql(label: str) -> str:
    """Functions under the names (and argument types) of core functions commands call."""
    return f"""
CREATE FUNCTION fencekit.attribution_lag() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('{label}'); RETURN 10; END $$;
CREATE FUNCTION fencekit.session_is(r oid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RETURN canary_log.hit('{label}'); END $$;
CREATE FUNCTION fencekit.check_postgres_version() RETURNS void LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('{label}'); END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencekit TO PUBLIC;
"""


def type_sql(label: str) -> str:
    return f"""
CREATE DOMAIN fencekit.token AS bigint CHECK (canary_log.hit('{label}'));
"""


#: The owner's own use of what it planted: every core canary runs (as the owner) here, so a
#: planter that could never fire is found.
CONTROL = [
    "INSERT INTO fencekit.meta (key, value) VALUES ('canary', 'x')",
    "UPDATE fencekit.meta SET value = 'y' WHERE key = 'canary'",
    "SELECT count(*) FROM fencekit.meta WHERE pg_catalog.length(key) + 0 = 3",
    "ANALYZE fencekit.meta",
    "SELECT * FROM fencekit.protected, fencekit.fences, fencekit.resources",
    "SELECT fencekit.attribution_lag(), fencekit.session_is(0), fencekit.check_postgres_version()",
    "SELECT 1::fencekit.token",
]


@dataclass(frozen=True)
class Variant:
    """One way schema fencekit can be there when an entry point runs: ``before_sql`` run by
    the superuser, then ``owner_sql`` by the table owner, then ``after_sql`` by the superuser."""

    name: str
    labels: tuple[str, ...]
    owner_sql: str
    before_sql: str = ""
    after_sql: str = ""


def _objects(owner: str, schema: str, function: str, type_: str, *, attached: bool) -> str:
    return (
        tables_sql(schema, owner)
        + (attached_sql(schema) if attached else "")
        + views_sql(schema)
        + functions_sql(function)
        + type_sql(type_)
    )


#: A DBA gives schema fencekit and everything in it to itself: the owner's code stays attached.
HAND_BACK = """
ALTER SCHEMA fencekit OWNER TO CURRENT_USER;
ALTER TABLE fencekit.meta OWNER TO CURRENT_USER;
ALTER STATISTICS fencekit.meta_st OWNER TO CURRENT_USER;
ALTER VIEW fencekit.protected OWNER TO CURRENT_USER;
ALTER VIEW fencekit.fences OWNER TO CURRENT_USER;
ALTER VIEW fencekit.resources OWNER TO CURRENT_USER;
ALTER DOMAIN fencekit.token OWNER TO CURRENT_USER;
ALTER FUNCTION fencekit.attribution_lag() OWNER TO CURRENT_USER;
ALTER FUNCTION fencekit.session_is(oid) OWNER TO CURRENT_USER;
ALTER FUNCTION fencekit.check_postgres_version() OWNER TO CURRENT_USER;
"""
SCHEMA = "CREATE SCHEMA fencekit; GRANT USAGE ON SCHEMA fencekit TO PUBLIC;"


def variants(owner: str) -> list[Variant]:
    mine = ("core-schema", "core-function", "core-type")
    left = ("core-leftover",)
    return [
        # the owner made schema fencekit and everything in it
        Variant(
            "owner's schema",
            mine,
            SCHEMA + _objects(owner, *mine, attached=True),
        ),
        # the installer made the schema and let the owner create in it; the owner the rest
        Variant(
            "owner's objects in the installer's schema",
            mine,
            _objects(owner, *mine, attached=True),
            before_sql=SCHEMA + f"GRANT CREATE ON SCHEMA fencekit TO {owner};",
        ),
        # the owner made it all, a DBA gave it to itself: with triggers, a rule and a policy;
        # and without them (defaults, a CHECK, index and statistics expressions, views,
        # functions and a domain that call the owner's code)
        Variant(
            "handed back, with triggers",
            left,
            SCHEMA + _objects(owner, *left * 3, attached=True),
            after_sql=HAND_BACK,
        ),
        Variant(
            "handed back, without triggers",
            left,
            SCHEMA + _objects(owner, *left * 3, attached=False),
            after_sql=HAND_BACK,
        ),
    ]


def planted_sql() -> str:
    """Every planted statement, for the page check (``_plant.planted_labels``)."""
    return "".join(v.owner_sql for v in variants("x"))
