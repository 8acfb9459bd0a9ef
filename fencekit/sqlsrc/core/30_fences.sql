-- Key and table fences: advancing the high-water mark and checking writes against it.

-- Judge a write of some keys under a token, and raise their fences to it: the locking protocol
-- of key and table fences. It keeps the fence contract (no write under a lower token commits
-- after a higher token advanced the fence) without making writers of one token wait for each
-- other:
--   * a key whose fence already reached the token is share-locked (FOR SHARE) and judged; any
--     number of writers under the same token hold that lock side by side;
--   * the other keys are raised by an upsert whose condition is the comparison; it takes the
--     row's exclusive lock, so it waits for every share holder (writers under the old token) to
--     commit, and later writers under the old token wait for it and then see the new fence.
-- Every lock is taken in key order, in one pass, so writers never deadlock on fences.
-- Key fences' triggers pass the common case themselves, inline (fencekit/sqlgen/key.py: every
-- key already at the token), and call this for the rest; table fences call it with ARRAY[''].
-- keys NULL means every key of the resource, seen or not (TRUNCATE): every fence of the
-- resource and its floor (35_floors.sql, which unseen keys start at) are raised to the token,
-- so no lower token is accepted anywhere in the resource afterwards. The floor's row is
-- locked first, then the fences in key order.
-- Returns the first offending key (highest fence first), or NULLs when every key accepts.
CREATE OR REPLACE FUNCTION fencekit.advance_fences(
  resource text, keys text[], token bigint, on_equal text,
  OUT bad_key text, OUT bad_fence bigint, OUT bad_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Generic plans: one index probe per key suits one key and a million alike, and a custom plan
-- for each array of keys cost a one-row write about 0.2 ms of planning.
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
  me xid8 := pg_catalog.pg_current_xact_id();
  start_at bigint;
  sorted text[];
  raise_keys text[];
  held integer;
  k text;
BEGIN
  IF keys IS NULL THEN
    INSERT INTO fencekit.floors AS fl (resource, floor, reason)
    VALUES (advance_fences.resource, token, 'truncate')
    ON CONFLICT ON CONSTRAINT floors_pkey DO UPDATE
       SET floor = token, set_at = pg_catalog.now(), reason = excluded.reason
     WHERE fl.floor < token;
    SELECT f.key, f.fence, CASE WHEN f.fence > token THEN 'stale' ELSE 'reused' END
      INTO bad_key, bad_fence, bad_reason
      FROM (SELECT f.key, f.fence, f.writer_xact FROM fencekit.fences f
             WHERE f.resource = advance_fences.resource
             ORDER BY f.key FOR UPDATE) AS f
     WHERE f.fence > token
        OR (on_equal = 'reject' AND f.fence = token AND f.writer_xact IS DISTINCT FROM me)
     ORDER BY f.fence DESC
     LIMIT 1;
    UPDATE fencekit.fences f
       SET fence = token, writer_xact = me, updated_at = pg_catalog.now()
     WHERE f.resource = advance_fences.resource AND f.fence < token;
    RETURN;
  END IF;
  IF pg_catalog.array_position(keys, NULL) IS NOT NULL THEN
    bad_reason := 'null_key';
    RETURN;
  END IF;
  -- A key without a fence starts at the resource's floor when it has one (35_floors.sql: set
  -- by fencekit move), so a token below it is stale there; a key with a fence is compared
  -- with the token alone.
  SELECT fl.floor INTO start_at FROM fencekit.floors fl WHERE fl.resource = advance_fences.resource;
  sorted := ARRAY(SELECT DISTINCT u.key FROM pg_catalog.unnest(keys) AS u(key) ORDER BY 1);
  -- Which keys to raise, as far as this statement's snapshot shows (OFFSET 0: one index
  -- lookup per key, however many fences the resource has).
  SELECT pg_catalog.array_agg(u.key ORDER BY u.o) FILTER (WHERE h.fence IS NULL),
         pg_catalog.count(h.fence)
    INTO raise_keys, held
    FROM pg_catalog.unnest(sorted) WITH ORDINALITY AS u(key, o)
    LEFT JOIN LATERAL (SELECT f.fence FROM fencekit.fences f
                        WHERE f.resource = advance_fences.resource AND f.key = u.key
                          AND f.fence >= token OFFSET 0) AS h ON true;
  IF held = 0 THEN
    -- Nothing reached the token yet (a new token, the common case here): one upsert.
    INSERT INTO fencekit.fences AS f (resource, key, fence, writer_xact)
    SELECT advance_fences.resource, u.key, GREATEST(token, start_at), me
      FROM pg_catalog.unnest(sorted) WITH ORDINALITY AS u(key, o)
     ORDER BY u.o
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
       SET fence = token, writer_xact = excluded.writer_xact, updated_at = pg_catalog.now()
     WHERE f.fence < token;
  ELSIF raise_keys IS NULL THEN
    PERFORM FROM pg_catalog.unnest(sorted) WITH ORDINALITY AS u(key, o),
            LATERAL (SELECT FROM fencekit.fences f
                      WHERE f.resource = advance_fences.resource AND f.key = u.key
                      FOR SHARE) AS l;
  ELSE
    -- Some keys to share, some to raise: one key at a time, in key order.
    FOREACH k IN ARRAY sorted LOOP
      IF k = ANY (raise_keys) THEN
        INSERT INTO fencekit.fences AS f (resource, key, fence, writer_xact)
        VALUES (advance_fences.resource, k, GREATEST(token, start_at), me)
        ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
           SET fence = token, writer_xact = excluded.writer_xact, updated_at = pg_catalog.now()
         WHERE f.fence < token;
      ELSE
        PERFORM FROM fencekit.fences f
         WHERE f.resource = advance_fences.resource AND f.key = k
           FOR SHARE;
      END IF;
    END LOOP;
  END IF;
  -- Every key's fence is locked now (shared or exclusive): what it holds cannot change.
  SELECT f.key, f.fence, CASE WHEN f.fence > token THEN 'stale' ELSE 'reused' END
    INTO bad_key, bad_fence, bad_reason
    FROM pg_catalog.unnest(sorted) AS u(key)
    JOIN LATERAL (SELECT f.key, f.fence, f.writer_xact FROM fencekit.fences f
                   WHERE f.resource = advance_fences.resource AND f.key = u.key OFFSET 0) AS f
      ON true
   WHERE f.fence > token
      OR (on_equal = 'reject' AND f.fence = token AND f.writer_xact IS DISTINCT FROM me)
   ORDER BY f.fence DESC
   LIMIT 1;
END
$fn$;

-- The highest fence of a resource (TRUNCATE must present a token not lower than it).
-- Why definer: the statement check runs as the writer, who may not read fencekit.fences (its
-- keys are other tables' key values). Touches: reads fencekit.fences only. Never runs: caller
-- code of any kind: a text argument compared with pg_catalog's text equality, a bigint max.
CREATE OR REPLACE FUNCTION fencekit.max_fence(resource text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.max(f.fence) FROM fencekit.fences f WHERE f.resource = max_fence.resource
$fn$;

-- The current fence of one key ('' for a table fence); NULL when none was set.
-- Why definer: as max_fence, for claim and for anyone checking one key (a key's fence is what
-- a write under a token would learn from its rejection anyway). Touches: reads one row of
-- fencekit.fences. Never runs: caller code: text arguments, pg_catalog's text equality.
CREATE OR REPLACE FUNCTION fencekit.current_fence(resource text, key text DEFAULT '') RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT f.fence FROM fencekit.fences f
   WHERE f.resource = current_fence.resource AND f.key = current_fence.key
$fn$;

-- Bind a named resource to the issuer whose tokens it takes. Protecting a second table with the
-- same resource and another issuer is an error: their tokens are not comparable.
CREATE OR REPLACE FUNCTION fencekit.bind_resource(resource text, issuer text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
  bound text;
BEGIN
  INSERT INTO fencekit.resources AS r (resource, issuer)
  VALUES (bind_resource.resource, bind_resource.issuer)
  ON CONFLICT (resource) DO NOTHING;
  SELECT r.issuer INTO bound FROM fencekit.resources r WHERE r.resource = bind_resource.resource;
  IF bound IS DISTINCT FROM bind_resource.issuer THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: resource %L takes tokens from issuer %L, not %L',
                                  bind_resource.resource, COALESCE(bound, 'any'),
                                  COALESCE(bind_resource.issuer, 'any')),
      HINT = 'Tokens of different issuers are never comparable; use another resource name.';
  END IF;
END
$fn$;

-- Slow paths of the generated triggers, when a write has no token or would be rejected.
-- SECURITY INVOKER: they run as the writer; bypass is judged by the session (bypass_allowed).

-- No token (even when the statement check saw one: a statement may clear it): true when the
-- session may bypass, false when on_missing=allow, else raises YF003. Every write it lets
-- through is counted ('bypassed' or 'unfenced', as fencekit.count_event counts) each time it
-- is asked with `counted`. Each check that lets a statement through asks once, counting: a
-- key fence's after the statement, a table or row fence's before it (a row fence's counts the
-- common rollout case, no token and no bypass, inline instead). A row fence's row trigger asks
-- without counting when its statement check saw no token (it counted the statement), and
-- counting when that check saw a token that was cleared since.
-- The bypass test reads the setting first: a plain tokenless write pays no call for it.
CREATE OR REPLACE FUNCTION fencekit.unfenced_write(tag text, relid oid, trigger_name text,
                                                   allow boolean, counted boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  what text;
BEGIN
  IF COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') <> ''
     AND fencekit.bypass_allowed(tag, relid, trigger_name) THEN
    what := 'bypassed';
  ELSIF allow THEN
    what := 'unfenced';
  ELSE
    PERFORM fencekit.reject('missing', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL);
  END IF;
  IF counted THEN  -- fencekit.count_event's count, inline: one call less per write
    PERFORM pg_catalog.nextval(
      pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':' || what)));
  END IF;
  RETURN what = 'bypassed';
END
$fn$;

-- A row write that the comparison rejects: true when bypassed (counted), else raises.
CREATE OR REPLACE FUNCTION fencekit.rejected_row(
  reason text, tag text, relid oid, trigger_name text, column_name text, row_data jsonb,
  token bigint, fence bigint)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF fencekit.bypass_allowed(tag, relid, trigger_name) THEN
    PERFORM fencekit.count_event(tag, relid, 'bypassed');
    RETURN true;
  END IF;
  PERFORM fencekit.reject(reason, tag, relid, trigger_name, column_name, NULL,
                          fencekit.row_key(relid, row_data), token, fence);
  RETURN false;
END
$fn$;

-- ------------------------------------------------------------------ key identity

-- How a key column's values are named in fencekit.fences, or an error: the family of its
-- type, for types whose equal values always print alike under the settings the key triggers
-- print keys under (see fencekit/sqlgen/key.py). Two types share a family only when every
-- value of one prints as the same value of the other does: a retype within a family keeps the
-- keys' text, and two tables sharing a named resource need equal families.
CREATE OR REPLACE FUNCTION fencekit.key_family(relid regclass, col text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  typ oid;
  typmod integer;
  coll oid;
  generated "char";
  shown text;
  t record;
  why text;
  instead text;
BEGIN
  SELECT a.atttypid, a.atttypmod, a.attcollation, a.attgenerated INTO typ, typmod, coll, generated
    FROM pg_catalog.pg_attribute a
   WHERE a.attrelid = relid AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s has no column %I to use as a key', relid, col);
  END IF;
  -- PostgreSQL 18: a virtual generated column has no value in the transition tables that a key
  -- fence reads its keys from (NULL, or an internal error), so it cannot name a key.
  IF generated = 'v' THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: key column %I of %s is a virtual generated column, '
                                  'which a key fence cannot read its keys from', col, relid),
      HINT = 'Make it GENERATED ALWAYS AS (...) STORED, or key the fence on the columns it is '
             'computed from.',
      COLUMN = col;
  END IF;
  shown := pg_catalog.format_type(typ, typmod);
  -- A domain's identity is its base type's.
  LOOP
    SELECT * INTO t FROM pg_catalog.pg_type WHERE oid = typ;
    EXIT WHEN t.typtype <> 'd';
    typ := t.typbasetype;
    IF t.typtypmod <> -1 THEN
      typmod := t.typtypmod;
    END IF;
  END LOOP;
  IF coll <> 0 AND NOT (SELECT c.collisdeterministic FROM pg_catalog.pg_collation c
                         WHERE c.oid = coll) THEN
    why := 'its collation is nondeterministic: values it calls equal are different strings';
    instead := 'a deterministic collation (COLLATE "C"), or a generated column holding a '
               'normalised form (e.g. lower())';
  ELSIF coll <> 0 AND (SELECT c.collnamespace FROM pg_catalog.pg_collation c WHERE c.oid = coll)
                      <> 'pg_catalog'::regnamespace THEN
    -- The key triggers sort a statement's keys under the column's collation, as the role
    -- that ran protect: a collation someone created is not theirs to resolve through.
    why := pg_catalog.format('its collation %s is not one of pg_catalog''s',
                             coll::regcollation);
    instead := 'a collation from pg_catalog (COLLATE "C", "POSIX" or the database default)';
  ELSIF typ IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN
    RETURN 'integer';
  ELSIF typ = 'text'::regtype OR (typ = 'varchar'::regtype AND typmod < 0) THEN
    RETURN 'text';
  ELSIF typ = 'varchar'::regtype THEN
    RETURN pg_catalog.format_type(typ, typmod);  -- storing trims trailing spaces beyond n
  ELSIF typ = 'bpchar'::regtype THEN
    RETURN 'character';  -- its text drops trailing spaces, which text and varchar keep
  ELSIF typ = 'numeric'::regtype THEN
    IF typmod >= 4 THEN
      RETURN 'numeric scale ' || ((typmod - 4) & 65535);
    END IF;
    why := 'without a declared scale, equal numbers print differently (1.0 and 1.00)';
    instead := 'numeric(p,s), which stores every value with the same scale';
  ELSIF typ IN ('uuid'::regtype, 'bool'::regtype, 'date'::regtype, 'bytea'::regtype) THEN
    RETURN pg_catalog.format_type(typ, NULL);
  ELSIF typ IN ('time'::regtype, 'timestamp'::regtype, 'timestamptz'::regtype) THEN
    -- With its precision (a value rounded to another one prints differently); 6 is the
    -- precision of an unbounded one.
    RETURN pg_catalog.format_type(typ, NULLIF(typmod, 6));
  ELSIF t.typtype = 'e' THEN
    why := 'an enum''s labels can be renamed (ALTER TYPE ... RENAME VALUE), which would '
           'silently give every key of that value a new fence';
    instead := 'text (with a CHECK constraint) or an integer code';
  ELSIF typ IN ('float4'::regtype, 'float8'::regtype) THEN
    why := 'floating-point values have no stable identity (0 = -0, rounding)';
    instead := 'numeric(p,s), bigint or text';
  ELSIF typ = 'interval'::regtype THEN
    why := 'equal intervals print differently (1 day = 24 hours)';
    instead := 'a bigint of microseconds, or text';
  ELSIF typ = 'timetz'::regtype THEN
    why := 'equal times print differently in other zones (10:00+01 = 09:00+00)';
    instead := 'time or timestamptz';
  ELSE
    why := 'fencekit cannot tell equal values apart from their text';
    instead := 'an integer type, numeric(p,s), text, varchar, char(n), uuid, boolean, date, '
               'time, timestamp, timestamptz or bytea (a generated column works)';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'YF000',
    MESSAGE = pg_catalog.format('fencekit: key column %I of %s has type %s, which cannot be '
                                'a key: %s', col, relid, shown, why),
    HINT = 'Use ' || instead || '.',
    COLUMN = col;
END
$fn$;

-- The families of a key's columns, in order (see key_family). The registry records them at
-- protect time: a column whose type changes later (ALTER COLUMN ... TYPE) would name its keys
-- differently, so status reports it and protect refuses to carry on silently.
CREATE OR REPLACE FUNCTION fencekit.key_families(relid regclass, cols text[]) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.array_agg(fencekit.key_family(relid, u.c) ORDER BY u.o)
    FROM pg_catalog.unnest(cols) WITH ORDINALITY AS u(c, o)
$fn$;

-- Protect-time check of a key fence's columns: each has a type with a stable identity, its
-- types are those it was protected with, and a named resource shared with other tables is
-- keyed by columns of the same families.
CREATE OR REPLACE FUNCTION fencekit.check_key_columns(relid regclass, cols text[], resource text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  mine text[] := fencekit.key_families(relid, cols);
  theirs text[];
  other record;
  other_rel regclass;
BEGIN
  FOR other IN SELECT p.schema_name, p.table_name, p.spec, p.key_families
                 FROM fencekit.protected p
                WHERE p.scope = 'key'
                  AND (p.resource = check_key_columns.resource
                       OR (p.schema_name, p.table_name)
                          = (SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c
                               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                              WHERE c.oid = relid)) LOOP
    other_rel := pg_catalog.to_regclass(pg_catalog.format('%I.%I', other.schema_name,
                                                          other.table_name));
    IF other_rel = relid THEN
      IF other.key_families IS NOT NULL AND other.key_families IS DISTINCT FROM mine
         AND other.spec -> 'key' = pg_catalog.to_jsonb(cols) THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
          MESSAGE = pg_catalog.format('fencekit: the key columns of %s changed type since it was '
                                      'protected (%s, now %s): its fences are named by the old '
                                      'text of each key', relid, other.key_families, mine),
          HINT = 'Restore the column types, or move the fences to the new key text (UPDATE '
                 'fencekit.fences as a fencekit_admin member), or unprotect and protect again '
                 '(the fences restart).';
      END IF;
      CONTINUE;
    END IF;
    IF other_rel IS NULL THEN
      -- Renamed away (or dropped) under its registered name: its fences are still the
      -- resource's, named by the families it was protected with.
      theirs := other.key_families;
    ELSE
      theirs := fencekit.key_families(
        other_rel, ARRAY(SELECT pg_catalog.jsonb_array_elements_text(other.spec -> 'key')));
    END IF;
    IF theirs IS DISTINCT FROM mine THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: %s shares resource %L with %s, but its key columns '
                                    'are %s and theirs %s', relid, resource,
                                    COALESCE(other_rel::text, pg_catalog.format(
                                      '%I.%I', other.schema_name, other.table_name)),
                                    mine, theirs),
        HINT = 'Tables sharing a key fence must name their keys alike: use key columns of the '
               'same types (integer types match each other, as do text and unbounded varchar; a '
               'varchar(n), a char(n), a time type''s precision and a numeric scale must be equal).';
    END IF;
  END LOOP;
END
$fn$;

-- Only the definer trigger functions of key and table fences (owned by whoever ran protect)
-- advance fences; writers never call it. Members of fencekit_admin may run protect.
REVOKE ALL ON FUNCTION fencekit.advance_fences(text, text[], bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.advance_fences(text, text[], bigint, text) TO fencekit_admin;
