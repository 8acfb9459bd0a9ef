# ruff: noqa: E501  (planted SQL reads best one statement a line)
"""The canary matrix's planters: one per mechanism of docs/dev/code-paths.md.

Every planter is SQL run by a non-superuser table owner (``{owner}``) in schema ``app``, which
it owns. A canary is ``canary_log.hit(id)``: it records whose rights it ran with in sequences
(``nextval``/``setval`` survive the rollback of a refused command), and tries something only a
superuser may do (set ``session_replication_role``). ``{t}`` is a table's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.security.canary import _core_plant

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "dev" / "code-paths.md"


def page_mechanisms() -> dict[str, str]:
    """id -> planted-on, for every row of the page's "Mechanisms" table."""
    text = PAGE.read_text()
    section = text.split("## Mechanisms", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|.*\| ([a-z]+) \|$", section, re.M)
    return dict(rows)


# ---------------------------------------------------------------- the canary itself

CANARY = """
CREATE SCHEMA canary_log;
CREATE FUNCTION canary_log.hit(label text) RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  su boolean;
  power boolean := false;
  who text;
BEGIN
  SELECT r.rolsuper INTO su FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
  BEGIN  -- only a superuser (or a role granted SET on it) may set this, even to its value
    PERFORM pg_catalog.set_config('session_replication_role',
                                  pg_catalog.current_setting('session_replication_role'), true);
    power := true;
  EXCEPTION WHEN OTHERS THEN power := false;
  END;
  who := CASE current_user::text WHEN '{owner}' THEN 'owner' WHEN '{writer}' THEN 'writer'
         ELSE 'other' END;
  IF su OR power THEN who := 'other'; END IF;
  PERFORM pg_catalog.nextval(pg_catalog.format('canary_log.%I', label || ':' || who)::regclass);
  IF who = 'other' THEN
    PERFORM pg_catalog.setval(pg_catalog.format('canary_log.%I', label || ':role')::regclass,
                              (SELECT r.oid FROM pg_catalog.pg_roles r
                                WHERE r.rolname = current_user)::bigint);
    PERFORM pg_catalog.setval(pg_catalog.format('canary_log.%I', label || ':session')::regclass,
                              (SELECT r.oid FROM pg_catalog.pg_roles r
                                WHERE r.rolname = session_user)::bigint);
  END IF;
  RETURN true;
EXCEPTION WHEN OTHERS THEN
  RAISE WARNING 'canary % could not record: %', label, SQLERRM;
  RETURN true;
END $$;
"""


def sequences(labels: list[str]) -> str:
    out = []
    for label in labels:
        for part in ("owner", "writer", "other", "role", "session"):
            out.append(f'CREATE SEQUENCE canary_log."{label}:{part}" MINVALUE 0 START 1;')
    out.append("GRANT USAGE ON SCHEMA canary_log TO PUBLIC;")
    out.append("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA canary_log TO PUBLIC;")
    return "\n".join(out)


# ---------------------------------------------------------------- owner's helpers and types

HELPERS = """
CREATE FUNCTION app.cint(label text) RETURNS int LANGUAGE plpgsql VOLATILE AS $$
BEGIN PERFORM canary_log.hit(label); RETURN 0; END $$;
CREATE FUNCTION app.imm(label text) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN PERFORM canary_log.hit(label); RETURN 0; END $$;
CREATE FUNCTION app.immb(label text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN RETURN canary_log.hit(label); END $$;
CREATE FUNCTION app.imm_row(label text, v int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN PERFORM canary_log.hit(label); RETURN v; END $$;
CREATE FUNCTION app.trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM canary_log.hit(TG_ARGV[0]);
  IF TG_LEVEL = 'ROW' AND TG_WHEN = 'BEFORE' THEN
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
  END IF;
  RETURN NULL;
END $$;

-- domain-default, domain-check, domain-check-constant, domain-variable
CREATE DOMAIN app.d_default AS int DEFAULT app.cint('domain-default');
CREATE DOMAIN app.d_check AS int CHECK (canary_log.hit('domain-check'));
CREATE DOMAIN app.d_const AS int CHECK (VALUE IS NULL OR VALUE > app.imm('domain-check-constant') - 1000000);
CREATE DOMAIN app.d_var AS int CHECK (canary_log.hit('domain-variable'));
-- range-input, multirange-input, composite-input
CREATE DOMAIN app.d_rin AS int CHECK (canary_log.hit('range-input'));
CREATE TYPE app.r_in AS RANGE (subtype = app.d_rin);
CREATE DOMAIN app.d_rmulti AS int CHECK (canary_log.hit('multirange-input'));
CREATE TYPE app.r_m AS RANGE (subtype = app.d_rmulti, multirange_type_name = app.r_mm);
CREATE DOMAIN app.d_comp AS int CHECK (canary_log.hit('composite-input'));
CREATE TYPE app.comp AS (f app.d_comp);
-- range-subtype-diff, exclusion-constraint
CREATE FUNCTION app.diff(a float8, b float8) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN PERFORM canary_log.hit('range-subtype-diff'); RETURN a - b; END $$;
CREATE TYPE app.r_diff AS RANGE (subtype = float8, subtype_diff = app.diff);
CREATE FUNCTION app.diff_x(a float8, b float8) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN PERFORM canary_log.hit('exclusion-constraint'); RETURN a - b; END $$;
CREATE TYPE app.r_excl AS RANGE (subtype = float8, subtype_diff = app.diff_x);
-- cast, json-cast
CREATE TYPE app.mood AS ENUM ('ok', 'bad');
CREATE FUNCTION app.mood_text(app.mood) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('cast'); RETURN 'ok'; END $$;
CREATE FUNCTION app.text_mood(text) RETURNS app.mood LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('cast'); RETURN 'ok'::app.mood; END $$;
CREATE FUNCTION app.mood_json(app.mood) RETURNS json LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('json-cast'); RETURN '"ok"'::json; END $$;
CREATE CAST (app.mood AS text) WITH FUNCTION app.mood_text(app.mood) AS ASSIGNMENT;
CREATE CAST (text AS app.mood) WITH FUNCTION app.text_mood(text) AS ASSIGNMENT;
CREATE CAST (app.mood AS json) WITH FUNCTION app.mood_json(app.mood);
-- deferred-by-owner-code, with-hold-cursor, session-setting, reset-role
CREATE TABLE app.side (n int);
CREATE CONSTRAINT TRIGGER side_deferred AFTER INSERT ON app.side DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION app.trg('deferred-by-owner-code');
GRANT INSERT ON app.side TO PUBLIC;
CREATE FUNCTION app.side_effects() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE me text := pg_catalog.current_setting('role');
BEGIN
  INSERT INTO app.side VALUES (1);
  BEGIN
    EXECUTE 'DECLARE canary_hold CURSOR WITH HOLD FOR SELECT canary_log.hit(''with-hold-cursor'')';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  PERFORM pg_catalog.set_config('search_path', 'app_sh, pg_catalog, public', false);
  BEGIN
    PERFORM pg_catalog.set_config('role', 'none', true);
    PERFORM canary_log.hit('reset-role');
    PERFORM pg_catalog.set_config('role', me, true);
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  RETURN NULL;
END $$;
"""

#: session-setting: what the owner's session-wide search_path puts first. Each shadow is a
#: correct implementation that also runs the canary.
SHADOWS = """
CREATE SCHEMA app_sh;
GRANT USAGE ON SCHEMA app_sh TO PUBLIC;
"""
_SHADOW_TYPES = {"int8": "bigint", "int4": "integer", "text": "text", "name": "name", "oid": "oid"}


def _shadows(schema: str, label: str, pairs: list[tuple[str, str]]) -> str:
    out = []
    for i, (left, right) in enumerate(pairs):
        out.append(
            f"CREATE FUNCTION {schema}.canary_eq{i}({left}, {right}) RETURNS boolean "
            f"LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN PERFORM canary_log.hit('{label}'); "
            f"RETURN $1::text OPERATOR(pg_catalog.=) $2::text; END $$;"
            f"CREATE OPERATOR {schema}.= (LEFTARG = {left}, RIGHTARG = {right}, "
            f"FUNCTION = {schema}.canary_eq{i});"
        )
    return "\n".join(out)


def shadow_sql() -> str:
    same = [(t, t) for t in _SHADOW_TYPES.values()]
    funcs = """
CREATE FUNCTION app_sh.current_setting(text) RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN PERFORM canary_log.hit('session-setting');
RETURN pg_catalog.current_setting($1); END $$;
CREATE FUNCTION app_sh.current_setting(text, boolean) RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN PERFORM canary_log.hit('session-setting');
RETURN pg_catalog.current_setting($1, $2); END $$;
CREATE FUNCTION app_sh.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('session-setting');
RETURN pg_catalog.set_config($1, $2, $3); END $$;
"""
    public = """
CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN PERFORM canary_log.hit('shadow-name'); RETURN pg_catalog.lower($1::text); END $$;
CREATE FUNCTION public.canary_max(varchar, varchar) RETURNS varchar LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('shadow-name');
RETURN CASE WHEN $1 IS NULL OR $2::text OPERATOR(pg_catalog.>) $1::text THEN $2 ELSE $1 END; END $$;
CREATE AGGREGATE public.max(varchar) (SFUNC = public.canary_max, STYPE = varchar);
"""
    return (
        SHADOWS
        + _shadows("app_sh", "session-setting", same)
        + funcs
        + public
        + _shadows(
            "public",
            "shadow-name",
            [("varchar", "varchar"), ("name", "text"), ("text", "name"), ("regclass", "text")],
        )
    )


# ---------------------------------------------------------------- per table


@dataclass(frozen=True)
class Table:
    name: str  # in schema app
    scope: str  # row, key, table
    partitioned: bool = False
    key: tuple[str, ...] = ("k",)  # a key fence's key columns


def table_sql(t: Table) -> str:
    """A table carrying every table-attached planter (partitioned: the ones a partitioned
    table takes, plus both partition-key planters)."""
    n = t.name
    cols = """
  id int NOT NULL,
  k int NOT NULL DEFAULT 1,
  kd date NOT NULL DEFAULT '2020-01-01',
  v int NOT NULL DEFAULT 0,
  c_default int DEFAULT app.cint('column-default'),
  c_ext int DEFAULT app.ext_member(),
  c_ddefault app.d_default,
  c_gen int GENERATED ALWAYS AS (app.imm_row('generated-column', v)) STORED,
  c_dcheck app.d_check,
  c_dconst app.d_const,
  c_var app.d_var,
  c_mood app.mood DEFAULT 'ok',
  c_rin app.r_in,
  c_rm app.r_mm,
  c_comp app.comp,
  c_rdiff app.r_diff,
  c_rexcl app.r_excl,
  CONSTRAINT canary_check CHECK (canary_log.hit('check-constraint'))"""
    if t.partitioned:
        out = f"""
CREATE TABLE app.{n} ({cols}
) PARTITION BY RANGE ((id + app.imm('partition-key-constant')), (app.imm_row('partition-key-row', id)));
CREATE TABLE app.{n}_p PARTITION OF app.{n} FOR VALUES FROM (MINVALUE, MINVALUE) TO (MAXVALUE, MAXVALUE);
CREATE UNIQUE INDEX ON app.{n}_p (id);
"""
    else:
        out = f"""
CREATE TABLE app.{n} ({cols},
  PRIMARY KEY (id),
  CONSTRAINT {n}_canary_excl EXCLUDE USING gist (c_rexcl WITH &&)
);
CREATE INDEX ON app.{n} ((v + app.imm('index-expression-constant')));
CREATE INDEX ON app.{n} (k) WHERE app.immb('partial-index-predicate');
CREATE INDEX ON app.{n} ((app.imm_row('index-expression-row', v)));
CREATE INDEX ON app.{n} USING gist (c_rdiff);
CREATE STATISTICS app.{n}_sc ON (v + app.imm('stats-expression-constant')) FROM app.{n};
CREATE STATISTICS app.{n}_sr ON (app.imm_row('stats-expression-row', v)) FROM app.{n};
CREATE TABLE app.{n}_child (CHECK (v > app.imm('child-check-constant') - 1000000)) INHERITS (app.{n});
CREATE RULE canary_rule AS ON UPDATE TO app.{n} DO ALSO SELECT canary_log.hit('rule');
CREATE VIEW app.{n}_v AS SELECT * FROM app.{n} WHERE canary_log.hit('view');
ALTER VIEW app.{n}_v ALTER COLUMN c_default SET DEFAULT app.cint('view-column-default');
CREATE TABLE app.{n}_fk (id int PRIMARY KEY,
  parent int REFERENCES app.{n} (id) ON DELETE CASCADE ON UPDATE CASCADE);
CREATE TRIGGER canary_fk AFTER INSERT OR UPDATE OR DELETE ON app.{n}_fk
  FOR EACH ROW EXECUTE FUNCTION app.trg('fk-cascade');
CREATE MATERIALIZED VIEW app.{n}_mv AS SELECT id, app.cint('matview') AS c FROM app.{n};
CREATE FUNCTION app.{n}_text(app.{n}) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM canary_log.hit('row-type-cast'); RETURN 'row'; END $$;
CREATE CAST (app.{n} AS text) WITH FUNCTION app.{n}_text(app.{n});
"""
    out += f"""
CREATE TRIGGER canary_row_b BEFORE INSERT OR UPDATE OR DELETE ON app.{n}
  FOR EACH ROW EXECUTE FUNCTION app.trg('trigger-row');
CREATE TRIGGER canary_row_a AFTER INSERT OR UPDATE OR DELETE ON app.{n}
  FOR EACH ROW EXECUTE FUNCTION app.trg('trigger-row');
CREATE TRIGGER canary_stmt AFTER INSERT OR UPDATE OR DELETE ON app.{n}
  FOR EACH STATEMENT EXECUTE FUNCTION app.trg('trigger-statement');
CREATE TRIGGER canary_trunc BEFORE TRUNCATE ON app.{n}
  FOR EACH STATEMENT EXECUTE FUNCTION app.trg('trigger-truncate');
CREATE CONSTRAINT TRIGGER canary_deferred AFTER INSERT OR UPDATE OR DELETE ON app.{n}
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION app.trg('deferred-trigger');
CREATE TRIGGER canary_side AFTER INSERT OR UPDATE OR DELETE ON app.{n}
  FOR EACH ROW EXECUTE FUNCTION app.side_effects();
ALTER TABLE app.{n} ENABLE ROW LEVEL SECURITY;
CREATE POLICY canary_policy ON app.{n} USING (canary_log.hit('rls-policy'))
  WITH CHECK (canary_log.hit('rls-policy'));
"""
    return out


def rows_sql(t: Table) -> str:
    """Rows to write (as the owner, under a token), with values in every planted column."""
    n = t.name
    fk = "" if t.partitioned else f"INSERT INTO app.{n}_fk VALUES (1, 1);"
    return (
        f"INSERT INTO app.{n} (id, k, v, c_dcheck, c_dconst, c_var, c_rin, c_rm, c_comp, "
        f"c_rdiff, c_rexcl) SELECT i, i, i, i, i, i, int4range(i, i + 1)::text::app.r_in, "
        f"'{{[1,2)}}'::app.r_mm, ROW(i)::app.comp, "
        f"app.r_diff(i, i + 0.5), app.r_excl(i, i + 0.5) FROM generate_series(1, 3) i;{fk}"
    )


def view_swap_sql(t: Table) -> str:
    """view-swap: the protected table renamed away, a view under its name."""
    n = t.name
    return f"""
ALTER TABLE app.{n} RENAME TO {n}_real;
CREATE VIEW app.{n} AS SELECT * FROM app.{n}_real WHERE canary_log.hit('view-swap');
"""


#: extension-member: the owner's function, which it adds to an extension it created. The
#: embedded server ships no trusted extension, so the build has a superuser create one and
#: hand it to the owner, as the owner's own CREATE EXTENSION would leave it.
EXTENSION = """
CREATE FUNCTION app.ext_member() RETURNS int LANGUAGE plpgsql VOLATILE AS $$
BEGIN PERFORM canary_log.hit('extension-member'); RETURN 0; END $$;
"""


def planted_labels() -> frozenset[str]:
    """Every mechanism id a canary is planted for: the labels the planted SQL passes to the
    canary (directly or through the owner's helper functions)."""
    every = CANARY + HELPERS + shadow_sql() + EXTENSION
    every += table_sql(Table("x", "row")) + table_sql(Table("x", "row", partitioned=True))
    every += view_swap_sql(Table("x", "row"))
    every += _core_plant.OWN + _core_plant.planted_sql()
    calls = r"(?:hit|cint|imm|immb|imm_row|trg)\(''?([a-z0-9-]+)'"
    return frozenset(re.findall(calls, every))
