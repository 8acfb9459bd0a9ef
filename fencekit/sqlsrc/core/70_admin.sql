-- Inspecting and repairing fences, and the views monitoring reads (postgres_exporter).

-- ------------------------------------------------------------------ the protected table

-- The tag (fencekit.protected) of the protected table that tbl is, NULL when no protected table
-- has tbl's name, or an error when tbl only has the name: a protected table's owner may rename it and put
-- a view (whose functions run as whoever reads it), a function-backed relation or another table
-- under the old name. Everything an admin or a DBA reads or writes of a protected table goes
-- through this first (fencekit fences, fencekit.set_fence, fencekit.key_text, move): tbl must
-- be the protected table (fencekit.protected_table: the oid protect recorded, or after a
-- restore a trigger of the table's that only an admin can attach), never a table that merely
-- carries a trigger named like fencekit's. Reads the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.registered_table(tbl regclass) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  p record;
  kind text;
  protected regclass;
BEGIN
  SELECT pr.* INTO p FROM fencekit.protected pr
   WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name)) = tbl;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  protected := fencekit.protected_table(p.tag);
  IF protected = tbl THEN
    RETURN p.tag;
  END IF;
  SELECT c.relkind::text INTO kind FROM pg_catalog.pg_class c WHERE c.oid = tbl;
  RAISE EXCEPTION USING ERRCODE = 'YF000',
    MESSAGE = pg_catalog.format(
      'fencekit: %s is not the table protected under that name (%s); fencekit reads and writes '
      'only the protected table itself, never a relation that took its name', tbl,
      CASE WHEN kind IN ('r', 'p') THEN 'another table, or the table without its fencekit '
                                        'triggers after a restore'
           WHEN kind = 'v' THEN 'a view' WHEN kind = 'm' THEN 'a materialized view'
           WHEN kind = 'f' THEN 'a foreign table' ELSE 'relkind ' || kind END),
    HINT = CASE WHEN protected IS NOT NULL
             THEN pg_catalog.format('The protected table was renamed to %s; fencekit '
                                    'status reports it and prints the fencekit rename to run.',
                                    protected)
             ELSE 'fencekit status reports what happened to the protected table.' END;
END
$fn$;

-- True when this session logged in as role r and acts as r: session_user, current_user and
-- the role the backend authenticated as (pg_stat_activity.usesysid, which neither SET ROLE
-- nor SET SESSION AUTHORIZATION changes) are all r. Code running in such a session reaches no
-- role r could not reach by itself: RESET ROLE and RESET SESSION AUTHORIZATION lead back to
-- r. SET ROLE or SET SESSION AUTHORIZATION in an admin's or a superuser's session is no
-- sandbox (the code under it can go back), so fencekit writes a user's table, which runs its
-- owner's code, only in a session for which this holds for the table's owner.
CREATE OR REPLACE FUNCTION fencekit.session_is(r oid) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT COALESCE(
    (SELECT a.oid FROM pg_catalog.pg_roles a WHERE a.rolname = session_user) = r
    AND (SELECT a.oid FROM pg_catalog.pg_roles a WHERE a.rolname = current_user) = r
    AND (SELECT s.usesysid FROM pg_catalog.pg_stat_activity s
          WHERE s.pid = pg_catalog.pg_backend_pid()) = r, false)
$fn$;

-- ------------------------------------------------------------------ key text

-- The built-in type a column's values are read as when an admin or a claim names them
-- (format_type text, typmod included): the column's type, or for a domain the type under it.
-- Raises for a type that is not built in all the way down (oid below FirstNormalObjectId):
-- its input, output and casts would be the caller's code. Reads the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.builtin_type(tbl regclass, col text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  typ oid;
  typmod integer;
  t record;
BEGIN
  SELECT a.atttypid, a.atttypmod INTO typ, typmod
    FROM pg_catalog.pg_attribute a
   WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
  IF typ IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s has no column %I', tbl, col);
  END IF;
  -- The type under the domains, and the typmod the innermost domain declares (a column of a
  -- domain type has none of its own).
  LOOP
    SELECT ty.typtype, ty.typbasetype, ty.typtypmod INTO t FROM pg_catalog.pg_type ty
     WHERE ty.oid = typ;
    EXIT WHEN t.typtype <> 'd';
    typ := t.typbasetype;
    IF t.typtypmod <> -1 THEN
      typmod := t.typtypmod;
    END IF;
  END LOOP;
  IF typ >= 16384 THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: column %I of %s has type %s, which is not built '
                                  'in: fencekit never reads values through code a user wrote '
                                  '(input functions, casts, domain checks)', col, tbl,
                                  pg_catalog.format_type(typ, typmod)),
      HINT = 'Name the row or key by columns of built-in types (or domains over them).',
      COLUMN = col;
  END IF;
  RETURN pg_catalog.format_type(typ, typmod);
END
$fn$;

-- The text a key fence names a key by (fencekit/sqlgen/key.py, key_expression), from the key
-- columns' values written as text, in key-column order: each value is read as its column's
-- BASE type and printed under the settings the key triggers pin (the SET clauses below are
-- KEY_SETTINGS; a test keeps them equal), so '2024-01-01 00:00+02' names the same key as the
-- trigger would. Raises when the table is not key-fenced or the values do not fit.
--
-- It runs no code the table's owner controls, whoever calls it (an admin's `fencekit fences
-- --key` / `fence set --key`, fencekit.claim): a domain's CHECK, input function or cast is
-- never evaluated. A domain key column is read as the built-in type under it (with its typmod),
-- through that type's built-in input and output functions and pg_catalog's casts, which only a
-- superuser can change; a key type that is not built-in all the way down is refused (protect
-- refuses those anyway: fencekit.key_family). A value the domain's CHECK would refuse names a
-- key no write can reach, so nothing is lost by not checking it.
CREATE OR REPLACE FUNCTION fencekit.key_text(tbl regclass, key_values text[]) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET timezone = 'UTC' SET datestyle = 'ISO, YMD' SET intervalstyle = 'postgres'
SET bytea_output = 'hex' SET extra_float_digits = 1
AS $fn$
DECLARE
  p record;
  cols text[];
  texts text[] := ARRAY[]::text[];
  v text;
BEGIN
  SELECT pr.* INTO p FROM fencekit.protected pr WHERE pr.tag = fencekit.registered_table(tbl);
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
    IF key_values[i] IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I cannot be NULL', cols[i]);
    END IF;
    PERFORM fencekit.key_family(tbl, cols[i]);  -- raises for a type that cannot be a key
    -- dynamic SQL: the key column's built-in type is known only at run time (%L quotes it)
    EXECUTE pg_catalog.format('SELECT (%L::%s)::pg_catalog.text', key_values[i],
                              fencekit.builtin_type(tbl, cols[i])) INTO v;
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
-- in index order). SECURITY INVOKER. Returns the old fence (NULL: none).
--
-- Key and table fences live in fencekit.fences: the repair touches fencekit's own state only
-- (the key is named by fencekit.key_text, which reads values as built-in types only).
--
-- A row fence lives in the user's table, so its repair writes that table, and writing a table
-- runs its owner's code: triggers, rules, CHECK constraints, index expressions, generated
-- columns, exclusion constraints, RLS policies. SET ROLE cannot contain that code (it can
-- RESET ROLE back to the session's login role), so the repair of a row runs only in a session
-- logged in as the table's owner (fencekit.session_is): the owner's code then runs with the
-- owner's rights, which are its own. Any other session, a superuser's included, is refused
-- before the table is read, with the statement to run as the owner. The session must also be a
-- member of fencekit_admin (every repair is audited in fencekit.repairs). The write runs with
-- fencekit.bypass off and row_security off (a forced policy makes the repair fail). A raise is
-- a write under the new fence as its token; a lower fence (allow_lower) is written the same way
-- with fencekit's own row trigger disabled for that one statement (the ALTER TABLE lock keeps
-- every writer out until commit). The primary key's values are read as built-in types and
-- compared with pg_catalog's operators (fencekit.builtin_type).
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
  who name := fencekit.session_role();
  owner_oid oid;
  saved_token text := pg_catalog.current_setting('fencekit.token', true);
  saved_bypass text := pg_catalog.current_setting('fencekit.bypass', true);
  saved_rls text := pg_catalog.current_setting('row_security');
  upd_trigger text;
  what text;
BEGIN
  PERFORM fencekit.repair_allowed(tbl::text, NULL, fence, false);
  SELECT pr.* INTO p FROM fencekit.protected pr WHERE pr.tag = fencekit.registered_table(tbl);
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
  -- Row fence: only in a session logged in as the table's owner (see above).
  col := COALESCE(p.spec ->> 'column', 'fencekit_fence');
  SELECT c.relowner INTO owner_oid FROM pg_catalog.pg_class c WHERE c.oid = tbl;
  IF NOT fencekit.session_is(owner_oid) THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('refusing to repair a row of %s in a session of %I: the repair writes '
                        'the table, which runs its owner''s code (triggers, rules, constraints, '
                        'index expressions, policies), and fencekit runs that code only in a '
                        'session logged in as the owner %s (SET ROLE cannot contain it)', tbl,
                        who, owner_oid::regrole),
      pg_catalog.format('Log in as %s (granted fencekit_admin for the repair: revoke it after) '
                        'and run: SELECT '
                        'fencekit.set_fence(%L, %L, %s, %s, %L); or: fencekit fence set %s '
                        '... --dsn <a DSN that logs in as %s>', owner_oid::regrole, tbl::text,
                        COALESCE(key_values, '{}')::text, fence,
                        CASE WHEN allow_lower THEN 'true' ELSE 'false' END, reason, tbl,
                        owner_oid::regrole), '42501');
  END IF;
  pk := ARRAY(SELECT a.attname::text
                FROM pg_catalog.pg_index i
                CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY u(attnum, o)
                JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum
               WHERE i.indrelid = tbl AND i.indisprimary
               ORDER BY u.o);
  IF pg_catalog.cardinality(pk) = 0 THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('%s has no primary key to find the row by', tbl),
      pg_catalog.format('Update the row as its owner under the new fence as the token: '
                        'SELECT set_config(''fencekit.token'', ''<fence>'', true); UPDATE %s '
                        'SET %I = <fence> WHERE ...;', tbl, col));
  END IF;
  IF pg_catalog.cardinality(COALESCE(key_values, '{}')) <> pg_catalog.cardinality(pk)
     OR pg_catalog.array_position(key_values, NULL) IS NOT NULL THEN
    PERFORM fencekit.repair_refused(
      pg_catalog.format('the primary key of %s is (%s): give %s value(s), not %s', tbl,
                        pg_catalog.array_to_string(pk, ', '), pg_catalog.cardinality(pk),
                        pg_catalog.cardinality(COALESCE(key_values, '{}'))),
      'Give one --key VALUE per primary key column, in index order.');
  END IF;
  SELECT pg_catalog.string_agg(pg_catalog.format('%I OPERATOR(pg_catalog.=) $1[%s]::%s', c, o,
                                                 fencekit.builtin_type(tbl, c)),
                               ' AND ' ORDER BY o)
    INTO conds FROM pg_catalog.unnest(pk) WITH ORDINALITY u(c, o);
  SELECT pg_catalog.jsonb_object_agg(c, key_values[o]) INTO rowkey
    FROM pg_catalog.unnest(pk) WITH ORDINALITY u(c, o);
  what := pg_catalog.format('%s row %s', tbl, rowkey);
  -- Until the end: no bypass, no policy applied.
  PERFORM pg_catalog.set_config('fencekit.bypass', '', true);
  PERFORM pg_catalog.set_config('row_security', 'off', true);
  -- dynamic SQL: the table and its primary key are known only at run time (regclass, %I)
  EXECUTE pg_catalog.format('SELECT true, %I FROM ONLY %s WHERE %s FOR UPDATE', col, tbl, conds)
    INTO found_row, old USING key_values;
  IF found_row IS NULL THEN
    -- A row of a partition or child: look there (the triggers are the same ones).
    -- dynamic SQL: the table and its primary key are known only at run time (regclass, %I)
    EXECUTE pg_catalog.format('SELECT true, %I FROM %s WHERE %s FOR UPDATE', col, tbl, conds)
      INTO found_row, old USING key_values;
  END IF;
  IF found_row IS NULL THEN
    PERFORM fencekit.repair_refused(pg_catalog.format('%s has no row %s', tbl, rowkey),
                                    'Check the primary key values (in index order).');
  END IF;
  lowered := fencekit.repair_allowed(what, old, fence, allow_lower);
  IF old IS DISTINCT FROM fence THEN
    -- The new fence is the write's token: the row triggers accept it as any write (a raise).
    PERFORM pg_catalog.set_config('fencekit.token', fence::text, true);
    IF lowered THEN
      -- A lower fence is stale to the row trigger: only for this statement, it is not run.
      upd_trigger := 'fencekit_' || p.tag || '_upd';
      -- dynamic SQL: the table and fencekit's trigger name are known only at run time
      EXECUTE pg_catalog.format('ALTER TABLE %s DISABLE TRIGGER %I', tbl, upd_trigger);
    END IF;
    -- dynamic SQL: the table and its primary key are known only at run time (regclass, %I)
    EXECUTE pg_catalog.format('UPDATE %s SET %I = $2 WHERE %s', tbl, col, conds)
      USING key_values, fence;
    IF lowered THEN
      -- dynamic SQL: the table and fencekit's trigger name are known only at run time
      EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE TRIGGER %I', tbl, upd_trigger);
    END IF;
  END IF;
  PERFORM pg_catalog.set_config('row_security', saved_rls, true);
  PERFORM pg_catalog.set_config('fencekit.token', COALESCE(saved_token, ''), true);
  PERFORM pg_catalog.set_config('fencekit.bypass', COALESCE(saved_bypass, ''), true);
  INSERT INTO fencekit.repairs (repaired_by, schema_name, table_name, scope, resource, key,
                                old_fence, new_fence, lowered, reason)
  VALUES (who, p.schema_name, p.table_name, 'row', NULL, rowkey::text,
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
         WHERE t.tgrelid = rel AND t.tgname LIKE E'fencekit\\_%' AND t.tgenabled <> 'O')
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
GRANT EXECUTE ON FUNCTION fencekit.key_text(regclass, text[]), fencekit.builtin_type(regclass, text),
  fencekit.registered_table(regclass), fencekit.session_is(oid),
  fencekit.set_resource_fence(text, text, bigint, boolean, text),
  fencekit.set_fence(regclass, text[], bigint, boolean, text) TO PUBLIC;
