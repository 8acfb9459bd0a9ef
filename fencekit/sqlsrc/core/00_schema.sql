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

-- The guard (00_guard.sql) ran first: schema fencekit, if there, is fencekit's side's alone.
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
-- was protected (see fencekit.key_families); NULL for other scopes. attnums: the attnum of
-- each column fencekit's objects read by name (a row fence's fence column; a key fence's key
-- columns, in order; NULL for a table fence), recorded by protect on the table whose oid is
-- table_oid: a column renamed away and another added under its name has another attnum (status
-- reports it, protect refuses it). child_attnums: a row fence's fence column attnum on each
-- partition and inheritance child, by the child's oid, compared on the same terms: a child can
-- be taken out of the tree, its column swapped and every other witness of it stripped.
-- function_oid: the oid fencekit.<tag>_stmt had when protect recorded these, and cluster_id
-- the cluster's system identifier (fencekit.cluster_id); they are this database's oids while
-- that function still has that oid in that cluster (fencekit.recorded_oids_hold). A restore
-- creates every table and function anew under other oids and copies this table as it was:
-- table_oid may then name no relation or another one, and the attnums count columns the
-- restore may have left out, so none of them is compared until protect records them again.
-- key_expressions: a key fence's generated key columns' generation expressions on the table
-- and each partition and child when protect ran, as fingerprints (fencekit.key_expressions),
-- compared on the same terms: changing one (SET EXPRESSION) rewrites the rows' keys without
-- any trigger.
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
  table_oid        oid,
  attnums          int2[],
  child_attnums    jsonb,
  function_oid     oid,
  cluster_id       bigint,
  key_expressions  jsonb,
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
