-- Schema, admin role and fencekit's own tables. Idempotent: safe to re-run, and re-running a
-- newer version upgrades in place.

DO $do$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'fencekit_admin') THEN
    -- Members may bypass fencing (audited) and repair fences. Needs CREATEROLE once; a DBA can
    -- create the role beforehand instead: CREATE ROLE fencekit_admin NOLOGIN;
    CREATE ROLE fencekit_admin NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'fencekit_writer') THEN
    -- Roles that take leases from fencekit's built-in issuer (fencekit.acquire). Writing a
    -- protected table needs no fencekit grant.
    CREATE ROLE fencekit_writer NOLOGIN;
  END IF;
  IF NOT pg_catalog.pg_has_role('fencekit_admin', 'fencekit_writer', 'MEMBER') THEN
    GRANT fencekit_writer TO fencekit_admin;
  END IF;
END
$do$;

-- Install only into a schema fencekit owns. Whoever owns schema fencekit, or a table, view,
-- sequence, type or function in it, or put a trigger, rule or policy on its tables, could run
-- their own code as the installer (a superuser, often) while this script writes fencekit.meta,
-- or replace a helper the core's definer functions call. So every such object must belong to
-- the installing role, a superuser or a member of fencekit_admin (protect leaves a table's
-- generated functions and counters to the role that ran it); the one exception is a row
-- fence's TRUNCATE check, which protect gives to its table's owner on purpose
-- (docs/security.md). Reads catalogs only.
DO $do$
DECLARE
  me oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
  found text;
BEGIN
  WITH trusted(oid) AS (
    SELECT me UNION SELECT r.oid FROM pg_catalog.pg_roles r
     WHERE r.rolsuper OR pg_catalog.pg_has_role(r.oid, 'fencekit_admin', 'MEMBER')
  ), ns AS (
    SELECT n.oid, n.nspowner FROM pg_catalog.pg_namespace n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'fencekit'
  )
  SELECT pg_catalog.string_agg(what, '; ' ORDER BY what) INTO found FROM (
    SELECT pg_catalog.format('schema fencekit (owner %s)', ns.nspowner::pg_catalog.regrole) AS what
      FROM ns WHERE ns.nspowner NOT IN (SELECT oid FROM trusted)
    UNION ALL
    SELECT pg_catalog.format('%s (owner %s)', c.oid::pg_catalog.regclass, c.relowner::pg_catalog.regrole)
      FROM pg_catalog.pg_class c JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE c.relowner NOT IN (SELECT oid FROM trusted)
    UNION ALL
    SELECT pg_catalog.format('type %s (owner %s)', t.oid::pg_catalog.regtype, t.typowner::pg_catalog.regrole)
      FROM pg_catalog.pg_type t JOIN ns ON t.typnamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE t.typowner NOT IN (SELECT oid FROM trusted)
    UNION ALL
    SELECT pg_catalog.format('function %s (owner %s)', p.oid::pg_catalog.regprocedure,
                             p.proowner::pg_catalog.regrole)
      FROM pg_catalog.pg_proc p JOIN ns ON p.pronamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE p.proowner NOT IN (SELECT oid FROM trusted)
       AND NOT (p.proname::pg_catalog.text OPERATOR(pg_catalog.~) '_trunc$'
                AND EXISTS (SELECT FROM pg_catalog.pg_trigger g
                              JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) g.tgrelid
                             WHERE g.tgfoid OPERATOR(pg_catalog.=) p.oid
                               AND c.relowner OPERATOR(pg_catalog.=) p.proowner))
    UNION ALL
    SELECT pg_catalog.format('trigger %I on %s', g.tgname, c.oid::pg_catalog.regclass)
      FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) g.tgrelid
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid WHERE NOT g.tgisinternal
    UNION ALL
    SELECT pg_catalog.format('rule %I on %s', w.rulename, c.oid::pg_catalog.regclass)
      FROM pg_catalog.pg_rewrite w JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) w.ev_class
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE w.rulename OPERATOR(pg_catalog.<>) '_RETURN'
    UNION ALL
    SELECT pg_catalog.format('policy %I on %s', y.polname, c.oid::pg_catalog.regclass)
      FROM pg_catalog.pg_policy y JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) y.polrelid
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
  ) x;
  IF found IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format(
        'fencekit: refusing to install into schema fencekit as %s: %s. Their owners could run '
        'their code with your rights while the install runs, or replace what fencekit''s '
        'functions call; nothing was changed', current_user, found),
      HINT = 'Schema fencekit and everything in it must belong to the installing role, a '
        'superuser or a member of fencekit_admin, with no trigger, rule or policy fencekit did '
        'not make. Drop what another role made (a schema made by someone else: DROP SCHEMA '
        'fencekit CASCADE, after saving any fences you need), or install as the role that '
        'owns it.';
  END IF;
END
$do$;

CREATE SCHEMA IF NOT EXISTS fencekit;
COMMENT ON SCHEMA fencekit IS 'fencekit: fencing tokens enforced by PostgreSQL. Managed by fencekit; do not edit.';
REVOKE CREATE ON SCHEMA fencekit FROM PUBLIC;
GRANT USAGE ON SCHEMA fencekit TO PUBLIC;

CREATE TABLE IF NOT EXISTS fencekit.meta (
  key   text PRIMARY KEY,
  value text NOT NULL
);

-- Key and table fences: the highest token accepted per resource and key ('' for a table fence).
CREATE TABLE IF NOT EXISTS fencekit.fences (
  resource    text NOT NULL,
  key         text NOT NULL,
  fence       bigint NOT NULL CHECK (fence > 0),
  writer_xact xid8,
  updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
  PRIMARY KEY (resource, key)
);

-- One row per protected table: the spec it was protected with and the template version that
-- generated its objects. key_families: a key fence's key column type families when the table
-- was protected (see fencekit.key_families); NULL for other scopes.
CREATE TABLE IF NOT EXISTS fencekit.protected (
  schema_name      text NOT NULL,
  table_name       text NOT NULL,
  tag              text NOT NULL UNIQUE,
  scope            text NOT NULL CHECK (scope IN ('row', 'key', 'table')),
  resource         text,
  spec             jsonb NOT NULL,
  template_version integer NOT NULL,
  protected_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
  key_families     text[],
  PRIMARY KEY (schema_name, table_name)
);

-- Named resources and the issuer whose tokens they take: tokens of different issuers are never
-- compared.
CREATE TABLE IF NOT EXISTS fencekit.resources (
  resource text PRIMARY KEY,
  issuer   text
);

REVOKE ALL ON fencekit.meta, fencekit.fences, fencekit.protected, fencekit.resources FROM PUBLIC;
GRANT SELECT ON fencekit.meta, fencekit.protected, fencekit.resources TO PUBLIC;
GRANT ALL ON fencekit.meta, fencekit.fences, fencekit.protected, fencekit.resources TO fencekit_admin;
-- Only the installer (the schema's owner) and superusers create in schema fencekit: a function
-- anyone else put there could be an overload that wins a call of fencekit's own code (a
-- SECURITY DEFINER one included) by matching its argument types more exactly, or carry a
-- generated function's name. fencekit_admin is trusted with fencekit's state, not with code.
GRANT USAGE ON SCHEMA fencekit TO fencekit_admin;
REVOKE CREATE ON SCHEMA fencekit FROM fencekit_admin;
