-- Inspecting and repairing fences, and the views monitoring reads (postgres_exporter).

-- Tables protected before core 4 have no lateness gauge yet: create it (create_counters makes
-- it for tables protected from now on). Quiet when every table has it.
DO $do$
DECLARE
  p record;
BEGIN
  FOR p IN SELECT pr.tag FROM fencekit.protected pr
            WHERE pg_catalog.to_regclass(pg_catalog.format('fencekit.%I',
                                                           pr.tag || ':max_late_ms')) IS NULL LOOP
    EXECUTE pg_catalog.format('CREATE SEQUENCE fencekit.%I', p.tag || ':max_late_ms');
    EXECUTE pg_catalog.format('GRANT ALL ON SEQUENCE fencekit.%I TO fencekit_admin',
                              p.tag || ':max_late_ms');
  END LOOP;
END
$do$;

-- ------------------------------------------------------------------ key text

-- The text a key fence names a key by (fencekit/sqlgen/key.py, key_expression), from the key
-- columns' values written as text, in key-column order: each value is cast to its column's
-- type and printed under the settings the key triggers pin (the SET clauses below are
-- KEY_SETTINGS; a test keeps them equal), so '2024-01-01 00:00+02' names the same key as the
-- trigger would. Raises when the table is not key-fenced or the values do not fit.
CREATE OR REPLACE FUNCTION fencekit.key_text(tbl regclass, key_values text[]) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET timezone = 'UTC' SET datestyle = 'ISO, YMD' SET intervalstyle = 'postgres'
SET bytea_output = 'hex' SET extra_float_digits = 1
AS $fn$
DECLARE
  p record;
  cols text[];
  texts text[] := '{}'::text[];
  typ text;
  v text;
BEGIN
  SELECT pr.* INTO p FROM fencekit.protected pr
   WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name)) = tbl;
  IF NOT FOUND OR p.scope <> 'key' THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s is not protected by a key fence', tbl),
      HINT = 'fencekit status lists the protected tables and their scope.';
  END IF;
  cols := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(p.spec -> 'key'));
  IF pg_catalog.cardinality(COALESCE(key_values, '{}')) <> pg_catalog.cardinality(cols) THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: the key of %s is (%s): give %s value(s), not %s',
                                  tbl, pg_catalog.array_to_string(cols, ', '),
                                  pg_catalog.cardinality(cols),
                                  pg_catalog.cardinality(COALESCE(key_values, '{}'))),
      HINT = 'Give one --key VALUE per key column, in key-column order.';
  END IF;
  FOR i IN 1 .. pg_catalog.cardinality(cols) LOOP
    SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO typ
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = tbl AND a.attname = cols[i] AND a.attnum > 0 AND NOT a.attisdropped;
    IF typ IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: %s has no key column %I any more', tbl, cols[i]);
    END IF;
    IF key_values[i] IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I cannot be NULL', cols[i]);
    END IF;
    -- dynamic SQL: the key column's type is known only at run time (%L quotes the value)
    EXECUTE pg_catalog.format('SELECT (%L::%s)::pg_catalog.text', key_values[i], typ) INTO v;
    texts := texts || v;
  END LOOP;
  IF pg_catalog.cardinality(texts) = 1 THEN
    RETURN texts[1];
  END IF;
  -- dynamic SQL: a record of as many texts as the key has columns, printed as a trigger does
  EXECUTE 'SELECT ROW(' || (SELECT pg_catalog.string_agg(pg_catalog.quote_literal(t)
                                                         || '::pg_catalog.text', ', ' ORDER BY o)
                              FROM pg_catalog.unnest(texts) WITH ORDINALITY u(t, o))
          || ')::pg_catalog.text' INTO v;
  RETURN v;
END
$fn$;

-- ------------------------------------------------------------------ repairs

-- Every repair through fencekit.set_fence / set_resource_fence, in the transaction that made it
-- (a repair rolled back leaves no row: it changed nothing). Members of fencekit_admin may read
-- and add rows, not change or delete them; a superuser or the installing role still can.
-- The ids come from a sequence of their own, not an identity column: a sequence owned by a
-- table cannot change owner on its own, which restores by another role and the ownership fix
-- that status prints need.
CREATE SEQUENCE IF NOT EXISTS fencekit.repair_ids;
CREATE TABLE IF NOT EXISTS fencekit.repairs (
  id           bigint NOT NULL DEFAULT pg_catalog.nextval('fencekit.repair_ids') PRIMARY KEY,
  repaired_at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
  repaired_by  text NOT NULL,  -- fencekit.session_role(): who asked, never a definer's role
  schema_name  text,           -- NULL for set_resource_fence on a resource no table uses
  table_name   text,
  scope        text NOT NULL CHECK (scope IN ('row', 'key', 'table')),
  resource     text,           -- key and table fences
  key          text NOT NULL,  -- key text ('' for a table fence); a row: its primary key as JSON
  old_fence    bigint,         -- NULL: the row had no fence yet
  new_fence    bigint NOT NULL,
  lowered      boolean NOT NULL,
  reason       text
);
REVOKE ALL ON fencekit.repairs FROM PUBLIC;
GRANT SELECT, INSERT ON fencekit.repairs TO fencekit_admin;
REVOKE ALL ON SEQUENCE fencekit.repair_ids FROM PUBLIC;
GRANT USAGE ON SEQUENCE fencekit.repair_ids TO fencekit_admin;

CREATE OR REPLACE FUNCTION fencekit.repair_refused(what text, hint text, code text DEFAULT 'YF000')
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RAISE EXCEPTION USING ERRCODE = code, MESSAGE = 'fencekit: ' || what, HINT = hint;
END
$fn$;

-- The checks every repair makes before it touches anything: the session (never current_user:
-- see fencekit.session_role) is a member of fencekit_admin; the new fence is a token; a lower
-- fence needs allow_lower (lowering lets tokens through that the fence rejected).
CREATE OR REPLACE FUNCTION fencekit.repair_allowed(what text, old_fence bigint, new_fence bigint,
                                                   allow_lower boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF NOT pg_catalog.pg_has_role(fencekit.session_role(), 'fencekit_admin', 'MEMBER') THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('role %I may not repair fences', fencekit.session_role()),
      'Only members of fencekit_admin repair fences; a DBA grants it: GRANT fencekit_admin TO '
      '<role>;', '42501');
  END IF;
  IF new_fence IS NULL OR new_fence < 1 THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('a fence is a positive bigint, not %s', COALESCE(new_fence::text, 'NULL')),
      'Give the new fence as a token, e.g. 35.');
  END IF;
  IF old_fence IS NOT NULL AND new_fence < old_fence AND NOT COALESCE(allow_lower, false) THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('refusing to lower the fence of %s from %s to %s', what, old_fence,
                        new_fence),
      'A lower fence accepts tokens this one rejects: stale writers holding them get through. '
      'If that is what you mean (e.g. the fence was set to a token no issuer will reach), '
      'pass allow_lower => true (fencekit fence set ... --allow-lower).');
  END IF;
  RETURN new_fence < old_fence;
END
$fn$;

-- Set the fence of one key (key text as fencekit.key_text gives it; '' for a table fence) of a
-- resource. SECURITY INVOKER: the caller needs fencekit_admin's rights on fencekit.fences. The
-- key must have a fence already: a key without one accepts every token, so there is nothing to
-- repair, and a typo would otherwise plant a fence on a key nobody uses. Returns the old fence.
CREATE OR REPLACE FUNCTION fencekit.set_resource_fence(
  resource text, key text, fence bigint, allow_lower boolean DEFAULT false,
  reason text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
  old bigint;
  lowered boolean;
  p record;
  what text := pg_catalog.format('resource %L key %L', set_resource_fence.resource,
                                 set_resource_fence.key);
BEGIN
  PERFORM fencekit.repair_allowed(what, NULL, set_resource_fence.fence, false);
  SELECT f.fence INTO old FROM fencekit.fences f
   WHERE f.resource = set_resource_fence.resource AND f.key = set_resource_fence.key
     FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('%s has no fence: nothing to repair', what),
      'A key without a fence accepts every token. Check the key (fencekit fences TABLE lists '
      'them; composite keys take every key column, in order).');
  END IF;
  lowered := fencekit.repair_allowed(what, old, set_resource_fence.fence, allow_lower);
  UPDATE fencekit.fences f
     SET fence = set_resource_fence.fence, writer_xact = pg_catalog.pg_current_xact_id(),
         updated_at = pg_catalog.now()
   WHERE f.resource = set_resource_fence.resource AND f.key = set_resource_fence.key;
  SELECT pr.schema_name, pr.table_name, pr.scope INTO p FROM fencekit.protected pr
   WHERE pr.resource = set_resource_fence.resource
   ORDER BY pr.schema_name, pr.table_name LIMIT 1;
  INSERT INTO fencekit.repairs (repaired_by, schema_name, table_name, scope, resource, key,
                                old_fence, new_fence, lowered, reason)
  VALUES (fencekit.session_role(), p.schema_name, p.table_name,
          COALESCE(p.scope, CASE WHEN set_resource_fence.key = '' THEN 'table' ELSE 'key' END),
          set_resource_fence.resource, set_resource_fence.key, old, set_resource_fence.fence,
          lowered, set_resource_fence.reason);
  RETURN old;
END
$fn$;

-- Set the fence of a protected table's key (key fence: the key columns' values, in order), of
-- the whole table (table fence: no values), or of one row (row fence: the primary key's values,
-- in index order; the row's fence column is written under fencekit.bypass, which the session
-- may use as a member of fencekit_admin, and counted once as a bypassed write). SECURITY
-- INVOKER: a row repair needs UPDATE on the table. Returns the old fence (NULL: none).
CREATE OR REPLACE FUNCTION fencekit.set_fence(
  tbl regclass, key_values text[], fence bigint, allow_lower boolean DEFAULT false,
  reason text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
DECLARE
  p record;
  col text;
  pk text[];
  conds text;
  found_row boolean;
  old bigint;
  lowered boolean;
  rowkey jsonb;
  saved_token text := pg_catalog.current_setting('fencekit.token', true);
  saved_bypass text := pg_catalog.current_setting('fencekit.bypass', true);
  what text;
BEGIN
  PERFORM fencekit.repair_allowed(tbl::text, NULL, fence, false);
  SELECT pr.* INTO p FROM fencekit.protected pr
   WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name)) = tbl;
  IF NOT FOUND THEN
    PERFORM fencekit.repair_refused(pg_catalog.format('%s is not protected', tbl),
                                    'fencekit status lists the protected tables.');
  END IF;
  IF p.scope = 'key' THEN
    RETURN fencekit.set_resource_fence(p.resource, fencekit.key_text(tbl, key_values), fence,
                                       allow_lower, reason);
  ELSIF p.scope = 'table' THEN
    IF pg_catalog.cardinality(COALESCE(key_values, '{}')) <> 0 THEN
      PERFORM fencekit.repair_refused(
        pg_catalog.format('%s has a table fence: it takes no key values', tbl),
        'Leave out --key (SQL: key_values => ''{}'').');
    END IF;
    RETURN fencekit.set_resource_fence(p.resource, '', fence, allow_lower, reason);
  END IF;
  -- Row fence: find the row by its primary key.
  col := COALESCE(p.spec ->> 'column', 'fencekit_fence');
  pk := ARRAY(SELECT a.attname::text
                FROM pg_catalog.pg_index i
                CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY u(attnum, o)
                JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum
               WHERE i.indrelid = tbl AND i.indisprimary
               ORDER BY u.o);
  IF pg_catalog.cardinality(pk) = 0 THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('%s has no primary key to find the row by', tbl),
      pg_catalog.format('Update the row as a member of fencekit_admin with fencekit.bypass on: '
                        'SELECT set_config(''fencekit.bypass'', ''on'', true); UPDATE %s SET %I '
                        '= <fence> WHERE ...;', tbl, col));
  END IF;
  IF pg_catalog.cardinality(COALESCE(key_values, '{}')) <> pg_catalog.cardinality(pk)
     OR pg_catalog.array_position(key_values, NULL) IS NOT NULL THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('the primary key of %s is (%s): give %s value(s), not %s', tbl,
                        pg_catalog.array_to_string(pk, ', '), pg_catalog.cardinality(pk),
                        pg_catalog.cardinality(COALESCE(key_values, '{}'))),
      'Give one --key VALUE per primary key column, in index order.');
  END IF;
  SELECT pg_catalog.string_agg(pg_catalog.format('%I = $1[%s]::%s', c, o,
           (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = tbl AND a.attname = c)), ' AND ' ORDER BY o)
    INTO conds FROM pg_catalog.unnest(pk) WITH ORDINALITY u(c, o);
  SELECT pg_catalog.jsonb_object_agg(c, key_values[o]) INTO rowkey
    FROM pg_catalog.unnest(pk) WITH ORDINALITY u(c, o);
  what := pg_catalog.format('%s row %s', tbl, rowkey);
  -- dynamic SQL: the table and its primary key are known only at run time (regclass, %I)
  EXECUTE pg_catalog.format('SELECT true, %I FROM %s WHERE %s FOR UPDATE', col, tbl, conds)
    INTO found_row, old USING key_values;
  IF found_row IS NULL THEN
    PERFORM fencekit.repair_refused(pg_catalog.format('%s has no row %s', tbl, rowkey),
                                    'Check the primary key values (in index order).');
  END IF;
  lowered := fencekit.repair_allowed(what, old, fence, allow_lower);
  -- No token and the audited bypass: the row triggers let the fence column through as written.
  PERFORM pg_catalog.set_config('fencekit.token', '', true);
  PERFORM pg_catalog.set_config('fencekit.bypass', 'on', true);
  -- dynamic SQL: the table and its primary key are known only at run time (regclass, %I)
  EXECUTE pg_catalog.format('UPDATE %s SET %I = $2 WHERE %s', tbl, col, conds)
    USING key_values, fence;
  PERFORM pg_catalog.set_config('fencekit.token', COALESCE(saved_token, ''), true);
  PERFORM pg_catalog.set_config('fencekit.bypass', COALESCE(saved_bypass, ''), true);
  INSERT INTO fencekit.repairs (repaired_by, schema_name, table_name, scope, resource, key,
                                old_fence, new_fence, lowered, reason)
  VALUES (fencekit.session_role(), p.schema_name, p.table_name, 'row', NULL, rowkey::text,
          old, fence, COALESCE(lowered, false), reason);
  RETURN old;
END
$fn$;

-- Repairs per table, for status and monitoring: counts only, readable by everyone (the audit
-- rows themselves, with key values and reasons, are for fencekit_admin).
CREATE OR REPLACE VIEW fencekit.repair_counts AS
SELECT r.schema_name, r.table_name, pg_catalog.count(*) AS repairs,
       pg_catalog.count(*) FILTER (WHERE r.lowered) AS lowered,
       pg_catalog.max(r.repaired_at) AS last_repaired_at
  FROM fencekit.repairs r
 GROUP BY r.schema_name, r.table_name;

-- ------------------------------------------------------------------ monitoring views

-- Worst lateness per protected table: the longest time between a key or table fence last
-- advancing and a rejection of a token it had passed (see fencekit.reject); NULL when no such
-- rejection was seen (row fences never have one). A gauge that survives rollback.
CREATE OR REPLACE VIEW fencekit.lateness AS
SELECT p.schema_name, p.table_name, p.scope,
       fencekit.counter_value(p.tag, 'max_late_ms') / 1000.0 AS max_lateness_seconds
  FROM fencekit.protected p;

-- What SQL alone can tell of drift, per protected table (fencekit status checks much more:
-- ownership, foreign triggers, descendants, outdated templates, column types): the table is
-- missing, a fencekit trigger is missing or does not fire for ordinary writes, a generated
-- function's body no longer matches the sha256 in its stamp.
CREATE OR REPLACE VIEW fencekit.drift AS
SELECT p.schema_name, p.table_name, p.scope, p.template_version,
       (rel IS NULL) AS table_missing,
       CASE WHEN rel IS NULL THEN 0 ELSE
         (SELECT pg_catalog.count(*) FROM pg_catalog.unnest(
            CASE p.scope WHEN 'table' THEN ARRAY['stmt', 'trunc']
                         WHEN 'key' THEN ARRAY['trunc', 'ins', 'upd', 'del']
                         ELSE ARRAY['stmt', 'trunc', 'ins', 'upd', 'del'] END) s(suffix)
           WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                              WHERE t.tgrelid = rel
                                AND t.tgname = 'fencekit_' || p.tag || '_' || s.suffix))
       END AS triggers_missing,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger t
         WHERE t.tgrelid = rel AND t.tgname LIKE 'fencekit\_%' AND t.tgenabled <> 'O')
         AS triggers_not_firing,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc f
         WHERE f.pronamespace = 'fencekit'::regnamespace
           AND pg_catalog.left(f.proname, pg_catalog.length(p.tag) + 1) = p.tag || '_'
           AND COALESCE(pg_catalog.substring(pg_catalog.obj_description(f.oid, 'pg_proc'),
                                             'sha256=([0-9a-f]{64})'), '')
               <> pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(f.prosrc, 'UTF8')),
                                    'hex'))
         AS functions_changed
  FROM fencekit.protected p
 CROSS JOIN LATERAL pg_catalog.to_regclass(pg_catalog.format('%I.%I', p.schema_name,
                                                             p.table_name)) AS rel;

GRANT SELECT ON fencekit.repair_counts, fencekit.lateness, fencekit.drift TO PUBLIC;
-- Anyone may call these; the repairs refuse sessions outside fencekit_admin with fencekit's
-- own error (42501) and, being SECURITY INVOKER, lend no rights.
GRANT EXECUTE ON FUNCTION fencekit.repair_refused(text, text, text),
  fencekit.repair_allowed(text, bigint, bigint, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.key_text(regclass, text[]),
  fencekit.set_resource_fence(text, text, bigint, boolean, text),
  fencekit.set_fence(regclass, text[], bigint, boolean, text) TO PUBLIC;
