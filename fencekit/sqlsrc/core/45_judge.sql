-- What every protected table's generated checks share (fencekit/sqlgen): the token a statement
-- is judged by, and the judgement of key and table fences. The generated functions keep only
-- what differs per table: its name, its policies, and how a key fence reads its keys.

-- The token a statement is judged by, read ONCE here (a statement may change the setting
-- between two checks, so nothing trusts an earlier read): NULL when there is none and the
-- write may go on (bypassed or on_missing=allow: counted, unless the caller's statement was
-- counted already: counted => false), else the token.
-- Raises YF005 for a bypass asked for by a session that may not (even if unneeded), YF004 for
-- a malformed token, YF007 for another issuer's token, YF003 for a missing one under
-- on_missing=reject. SECURITY INVOKER: it runs as the writer and writes nothing itself.
CREATE OR REPLACE FUNCTION fencekit.statement_token(
  tag text, relid oid, trigger_name text, allow boolean, issuer text, counted boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  raw text := pg_catalog.current_setting('fencekit.token', true);
  said text;
BEGIN
  IF COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') <> '' THEN
    PERFORM fencekit.bypass_allowed(tag, relid, trigger_name);
  END IF;
  IF raw IS NULL OR raw = '' THEN
    PERFORM fencekit.unfenced_write(tag, relid, trigger_name, allow, counted);
    RETURN NULL;
  END IF;
  -- A token is a canonical positive bigint; the regular expression settles every token below
  -- 10^18, is_valid_token the 19-digit ones.
  IF NOT (raw ~ '^[1-9][0-9]{0,17}$' OR fencekit.is_valid_token(raw)) THEN
    PERFORM fencekit.reject('malformed', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL,
                            raw);
  END IF;
  said := pg_catalog.current_setting('fencekit.issuer', true);
  IF issuer IS NOT NULL AND said <> '' AND said <> issuer THEN
    PERFORM fencekit.reject('issuer_mismatch', tag, relid, trigger_name, NULL, NULL, NULL,
                            raw::bigint, NULL, issuer);
  END IF;
  RETURN raw::bigint;
END
$fn$;

-- Judge a write of some keys (a key fence's statement; ARRAY[''] for a table fence; NULL for
-- every key of the resource: TRUNCATE under a key fence) under the statement's token, and
-- advance their fences. The common case ends in one query: every key's fence already holds
-- the token (the holder writing again) and is share-locked, in key order, so writers under one
-- token never wait for each other. The next most common, a new token that no key's fence has
-- reached yet, is one upsert here (advance_fences' own, inline: a definer call and its settings
-- saved per statement) that raises every key in key order; when it raises them all to the
-- token, the write is accepted. Anything else goes to advance_fences (30_fences.sql), which
-- takes every lock in key order in one pass, raises what is lower and reports the worst
-- offender: rejected here, or counted when the session may bypass.
-- SECURITY DEFINER (owner: the installer) because it writes fencekit.fences, which writers may
-- not; EXECUTE only for fencekit_admin, whose members own the generated definer trigger
-- functions that call it. It reads and writes fencekit's own tables and takes text keys and a
-- bigint token as arguments: no cast, operator, policy or trigger of a user's table or type
-- runs in it (the generated trigger computes the keys' text, under pinned settings, before).
-- Lease-bound: the token must be the live lease of every key written; for TRUNCATE (keys NULL)
-- of every key the resource has a fence for, as if each were written.
CREATE OR REPLACE FUNCTION fencekit.judge_fences(
  tag text, relid oid, trigger_name text, resource text, keys text[], token bigint,
  on_equal text, lease_bound boolean, key_column text DEFAULT NULL,
  key_label text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Generic plans, as advance_fences: the plan cache otherwise keeps choosing a custom plan for
-- the common-case query and plans it again on every call (about 0.15 ms a statement).
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
  -- The call's collation is "C" (TG_NAME is a name): compare under the default collation, the
  -- one fencekit.fences' index was built with, or no index is used at all.
  res text COLLATE "default" := resource;
  ks text[] COLLATE "default" := keys;
  eq text COLLATE "default" := on_equal;
  me xid8 := pg_catalog.pg_current_xact_id();
  locked bigint;
  reached bigint;
  raised bigint;
  bad record;
  lb record;
BEGIN
  IF keys IS NULL AND lease_bound THEN
    -- TRUNCATE deletes every key's rows: the token must hold the lease of every fenced key.
    SELECT * INTO lb FROM fencekit.lease_mismatch(res,
      ARRAY(SELECT f.key FROM fencekit.fences f WHERE f.resource = res ORDER BY f.key), token);
    IF lb.bad_key IS NOT NULL AND NOT fencekit.bypass_allowed(tag, relid, trigger_name) THEN
      PERFORM fencekit.reject('lease_mismatch', tag, relid, trigger_name, key_column,
        fencekit.lease_resource(resource, lb.bad_key),
        CASE WHEN key_label IS NOT NULL
             THEN pg_catalog.jsonb_build_object(key_label, lb.bad_key) END,
        token, lb.lease_token);
    END IF;
  END IF;
  IF keys IS NOT NULL THEN
    IF pg_catalog.cardinality(keys) = 0 THEN
      RETURN;  -- no rows written
    END IF;
    IF pg_catalog.array_position(keys, NULL) IS NOT NULL THEN
      PERFORM fencekit.reject('usage', tag, relid, trigger_name, key_column, resource, NULL,
                              token, NULL,
                              'a key column of a key fence is NULL; key columns must be NOT NULL');
    END IF;
    IF lease_bound THEN
      SELECT * INTO lb FROM fencekit.lease_mismatch(res, ks, token);
      IF lb.bad_key IS NOT NULL AND NOT fencekit.bypass_allowed(tag, relid, trigger_name) THEN
        PERFORM fencekit.reject('lease_mismatch', tag, relid, trigger_name, key_column,
          fencekit.lease_resource(resource, lb.bad_key),
          CASE WHEN key_label IS NOT NULL
               THEN pg_catalog.jsonb_build_object(key_label, lb.bad_key) END,
          token, lb.lease_token);
      END IF;
    END IF;
    -- One query for the common case (OFFSET 0: one index lookup per key, however many fences
    -- the resource has): count the keys whose fence holds the token, and only when that is
    -- every key, share-lock them in the order given (the generated triggers sort the keys);
    -- and count the keys whose fence reached the token, for the next case.
    WITH j AS (
           SELECT pg_catalog.count(*) FILTER (
                    WHERE (h.fence = token AND (on_equal <> 'reject' OR h.writer_xact = me))
                          IS NOT TRUE) AS todo,
                  pg_catalog.count(h.fence) AS reached
             FROM pg_catalog.unnest(ks) AS u(key)
             LEFT JOIN LATERAL (
                    SELECT f.fence, f.writer_xact FROM fencekit.fences f
                     WHERE f.resource = res AND f.key = u.key
                       AND f.fence >= token OFFSET 0) AS h ON true),
         l AS (
           SELECT FROM pg_catalog.unnest(ks) AS u(key), LATERAL (
                    SELECT FROM fencekit.fences f
                     WHERE f.resource = res AND f.key = u.key
                       AND f.fence = token
                       AND (on_equal <> 'reject' OR f.writer_xact = me)
                     FOR SHARE) AS h
            WHERE (SELECT j.todo FROM j) = 0)
    SELECT (SELECT pg_catalog.count(*) FROM l), (SELECT j.reached FROM j) INTO locked, reached;
    IF locked = pg_catalog.cardinality(keys) THEN
      RETURN;  -- every key's fence holds the token, and is share-locked
    END IF;
    IF reached = 0 THEN
      -- A new token (no key's fence reached it in this statement's snapshot): advance_fences'
      -- upsert, inline. A key without a fence starts at the resource's floor (35_floors.sql);
      -- the upsert takes every key's exclusive lock in key order, raising it or, when a
      -- concurrent writer raised it first, leaving it (its fence then reached the token).
      -- Only when every key was raised to the token itself is the write accepted here.
      IF pg_catalog.cardinality(ks) > 1 THEN
        ks := ARRAY(SELECT DISTINCT u.key FROM pg_catalog.unnest(ks) AS u(key) ORDER BY 1);
      END IF;
      WITH up AS (
             INSERT INTO fencekit.fences AS f (resource, key, fence, writer_xact)
             SELECT res, u.key,
                    GREATEST(token, (SELECT fl.floor FROM fencekit.floors fl
                                      WHERE fl.resource = res)), me
               FROM pg_catalog.unnest(ks) WITH ORDINALITY AS u(key, o)
              ORDER BY u.o
             ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
                SET fence = token, writer_xact = excluded.writer_xact,
                    updated_at = pg_catalog.now()
              WHERE f.fence < token
             RETURNING f.fence)
      SELECT pg_catalog.count(*) FILTER (WHERE up.fence = token) INTO raised FROM up;
      IF raised = pg_catalog.cardinality(ks) THEN
        RETURN;  -- every key raised to the token by this write, and exclusively locked
      END IF;
      -- Otherwise every key is locked now; advance_fences finds the worst offender.
    END IF;
  END IF;
  SELECT * INTO bad FROM fencekit.advance_fences(res, ks, token, eq);
  IF bad.bad_reason IS NULL THEN
    RETURN;
  END IF;
  IF fencekit.bypass_allowed(tag, relid, trigger_name) THEN
    PERFORM fencekit.count_event(tag, relid, 'bypassed');
    RETURN;
  END IF;
  PERFORM fencekit.reject(bad.bad_reason, tag, relid, trigger_name, key_column, resource,
    CASE WHEN key_label IS NOT NULL AND keys IS NOT NULL
         THEN pg_catalog.jsonb_build_object(key_label, bad.bad_key) END,
    token, bad.bad_fence);
END
$fn$;

REVOKE ALL ON FUNCTION fencekit.judge_fences(text, oid, text, text, text[], bigint, text, boolean,
                                             text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.judge_fences(text, oid, text, text, text[], bigint, text,
                                                boolean, text, text) TO fencekit_admin;

-- TRUNCATE of a row-fenced table under `token`: stale when any row's fence (`fence`: the
-- highest, which the table's generated fencekit.<tag>_trunc() reads as the table's owner) is
-- higher; counted when the session may bypass, else YF001. SECURITY INVOKER: it takes two
-- bigints and reads nothing of the table.
CREATE OR REPLACE FUNCTION fencekit.judge_row_truncate(tag text, relid oid, trigger_name text,
                                                       token bigint, fence bigint)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF fence > token THEN
    IF fencekit.bypass_allowed(tag, relid, trigger_name) THEN
      PERFORM fencekit.count_event(tag, relid, 'bypassed');
    ELSE
      PERFORM fencekit.reject('stale', tag, relid, trigger_name, NULL, NULL, NULL, token, fence);
    END IF;
  END IF;
END
$fn$;

-- Before a row fence's TRUNCATE check reads the fences of `rel` (the truncated table, by OID,
-- never by name) as current_user (fencekit.<tag>_trunc() runs as its owner, the table's owner):
-- the fence column must still be a plain bigint (max() of another type would compare other
-- values), and `rel` and every partition and inheritance child under it must be owned by
-- current_user. Reading a table runs its owner's code (index, statistics and partition key
-- expressions are folded while the read is planned): it runs with the rights of the role that
-- defined it, or not at all. A table given to another owner after protect, or a child owned by
-- someone else, fails closed (YF000) until protect runs again; so does a table that forces
-- row-level security on its owner (unless the owner has BYPASSRLS). Reads the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.check_fence_column(tag text, relid oid, trigger_name text,
                                                       rel regclass, col name)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  stranger regclass;
BEGIN
  IF (SELECT a.atttypid FROM pg_catalog.pg_attribute a
       WHERE a.attrelid = rel AND a.attname = col AND NOT a.attisdropped)
     IS DISTINCT FROM 'int8'::regtype THEN
    PERFORM fencekit.reject('usage', tag, relid, trigger_name, col, NULL, NULL, NULL, NULL,
                            'the fence column is no longer a bigint; protect the table again');
  END IF;
  WITH RECURSIVE tree(oid) AS (
         SELECT rel::oid
         UNION
         SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.oid)
  SELECT c.oid::regclass INTO stranger
    FROM tree JOIN pg_catalog.pg_class c ON c.oid = tree.oid
   WHERE c.relowner <> (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
   LIMIT 1;
  IF stranger IS NULL AND NOT (SELECT r.rolbypassrls FROM pg_catalog.pg_roles r
                                 WHERE r.rolname = current_user) THEN
    -- A policy forced on the owner could hide rows (and fences) from the check, and what it
    -- hides can depend on the writer's own settings: refused rather than judged on a part.
    WITH RECURSIVE tree(oid) AS (
           SELECT rel::oid
           UNION
           SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.oid)
    SELECT c.oid::regclass INTO stranger
      FROM tree JOIN pg_catalog.pg_class c ON c.oid = tree.oid
     WHERE c.relrowsecurity AND c.relforcerowsecurity
     LIMIT 1;
    IF stranger IS NOT NULL THEN
      PERFORM fencekit.reject('usage', tag, relid, trigger_name, col, NULL, NULL, NULL, NULL,
        pg_catalog.format('%s forces row-level security on its owner %I, so the TRUNCATE check, '
                          'which reads every row''s fence as the owner, cannot see every row; '
                          'ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, or give %I BYPASSRLS',
                          stranger, current_user, stranger, current_user));
    END IF;
    RETURN;
  END IF;
  IF stranger IS NOT NULL THEN
    PERFORM fencekit.reject('usage', tag, relid, trigger_name, col, NULL, NULL, NULL, NULL,
      pg_catalog.format('the TRUNCATE check reads the fences of %s as %I, the role that owned '
                        'the table at protect, but %s is owned by %s; protect the table again '
                        '(as a superuser or as its owner)', rel, current_user, stranger,
                        (SELECT c.relowner::regrole FROM pg_catalog.pg_class c
                          WHERE c.oid = stranger)));
  END IF;
END
$fn$;
