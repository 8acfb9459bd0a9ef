-- Counting and raising rejections. Counters are sequences because nextval() and setval() are
-- not rolled back: a rejection aborts its transaction, and the count must survive that.

CREATE OR REPLACE FUNCTION fencekit.counter_reasons() RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT ARRAY['stale', 'reused', 'missing', 'malformed', 'bypass_refused', 'lease_mismatch',
               'issuer_mismatch', 'usage', 'unfenced', 'bypassed']
$fn$;

-- Every per-table sequence: a counter per reason, the last rejection time (epoch ms) per
-- rejection reason ('last_at:<reason>': a row of fencekit.rejections means its reason only),
-- and two gauges, the largest gap of a stale token and the worst lateness (ms, see
-- fencekit.reject) seen. 'unfenced' and 'bypassed' count writes let through: no time is kept.
-- 'unattributed' and 'last_at:unattributed' count the tokenless statements whose writer could
-- not be recorded (fencekit.record_unfenced_writer found its record busy, or the attribution
-- log full) and when; 'logged' and 'last_at:logged' number the appends to the attribution
-- log and say when the last was made (22_attribution.sql).
CREATE OR REPLACE FUNCTION fencekit.counter_names() RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT fencekit.counter_reasons()
         || ARRAY['max_gap', 'max_late_ms', 'unattributed', 'last_at:unattributed', 'logged',
                  'last_at:logged']
         || ARRAY(SELECT 'last_at:' || r
                    FROM pg_catalog.unnest(fencekit.counter_reasons()) AS r
                   WHERE r <> ALL (ARRAY['unfenced', 'bypassed']))
$fn$;

-- Per-table counters (fencekit.counter_names). Called by the generated protect script, and by
-- the install for every protected table (below). Everyone may read them (they are what the
-- fencekit.rejections view shows) and may add to 'unfenced' and 'bypassed': USAGE allows
-- nextval(), never setval() or a reset, so a writer counts its own tokenless or bypassed write
-- as itself, with no SECURITY DEFINER function between (fencekit.count_event). What that lends:
-- anyone may make those two counts larger, never smaller; a write is never left out. The
-- rejection counters and the gauges are written only by fencekit.reject.
CREATE OR REPLACE FUNCTION fencekit.create_counters(tag text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY fencekit.counter_names() LOOP
    -- dynamic SQL: a counter is a sequence named after the table's tag (%I quotes it)
    EXECUTE pg_catalog.format('CREATE SEQUENCE IF NOT EXISTS fencekit.%I',
                              tag || ':' || r);
    EXECUTE pg_catalog.format('GRANT ALL ON SEQUENCE fencekit.%I TO fencekit_admin',
                              tag || ':' || r);
    EXECUTE pg_catalog.format('GRANT SELECT ON SEQUENCE fencekit.%I TO PUBLIC', tag || ':' || r);
    IF r IN ('unfenced', 'bypassed') THEN
      -- dynamic SQL: the same sequence, named after the table's tag (%I quotes it)
      EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE fencekit.%I TO PUBLIC',
                                tag || ':' || r);
    END IF;
  END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION fencekit.drop_counters(tag text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY fencekit.counter_names() LOOP
    -- dynamic SQL: a counter is a sequence named after the table's tag (%I quotes it)
    EXECUTE pg_catalog.format('DROP SEQUENCE IF EXISTS fencekit.%I', tag || ':' || r);
  END LOOP;
END
$fn$;

-- Whether this transaction is writing ``relid`` (or holds a lock only a writer can take on it),
-- and ``relid`` is the table protected under ``tag`` or one of its partitions or children: it
-- has a trigger calling one of fencekit.<tag>_*'s functions, which nobody but their owner and
-- fencekit_admin may attach (EXECUTE is revoked from PUBLIC), and which follow the table
-- through a rename (not a row fence's TRUNCATE check: the table's owner owns it, and may put it
-- on any table of its own). fencekit.reject acts only for such callers: a definer function cannot see
-- who called it, but a role that may not write a table cannot hold RowExclusiveLock on it.
-- It reads pg_locks, the whole server's lock table, so it runs on the rejection path only,
-- never for a write that passes (fencekit.count_event needs no such check).
CREATE OR REPLACE FUNCTION fencekit.writing(tag text, relid oid) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT EXISTS (SELECT FROM pg_catalog.pg_locks l
                  WHERE l.locktype = 'relation' AND l.pid = pg_catalog.pg_backend_pid()
                    AND l.relation = relid AND l.granted
                    AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                                   'AccessExclusiveLock'))
     AND EXISTS (SELECT FROM pg_catalog.pg_trigger t
                   JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
                  WHERE t.tgrelid = relid
                    AND p.pronamespace = 'fencekit'::regnamespace
                    -- The exact names of the table's generated trigger functions (sqlgen), not
                    -- a prefix: another table named '<tag>_x' has functions '<tag>_x_<hash>_*'.
                    AND p.proname = ANY (ARRAY[tag || '_ins', tag || '_upd', tag || '_del',
                                               tag || '_cross_in', tag || '_cross_out',
                                               tag || '_stmt']))
$fn$;

CREATE OR REPLACE FUNCTION fencekit.refuse_caller(tag text, relid oid, what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '42501',
    MESSAGE = pg_catalog.format('fencekit: %s acts only for a transaction that is writing the '
                                'table protected as %L (called for %s)', what, tag,
                                relid::pg_catalog.regclass),
    HINT = 'fencekit counts and raises rejections itself; nothing else needs to call it.';
END
$fn$;

-- A counter's value, NULL when the table has no such counter. Runs as the caller: SELECT on
-- every counter is granted to PUBLIC (create_counters).
CREATE OR REPLACE FUNCTION fencekit.counter_value(tag text, counter text) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.pg_sequence_last_value(
           pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':' || counter)))
$fn$;

-- Count one write that fencekit let through without judging a token: 'unfenced' (no token,
-- on_missing = allow) or 'bypassed' (the audited bypass). Every such write calls it; no setting
-- decides whether it counts. Runs as the writer, who may nextval() these two counters and no
-- other (create_counters): a sequence, so that the count costs the same whatever other sessions
-- do, and survives a rollback like the rejection counts. A table protected by a template without
-- the counter is not counted rather than failed.
CREATE OR REPLACE FUNCTION fencekit.count_event(tag text, relid oid, reason text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF reason IS DISTINCT FROM 'unfenced' AND reason IS DISTINCT FROM 'bypassed' THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = pg_catalog.format('fencekit.count_event counts writes let through (unfenced, '
                                  'bypassed) on %s, not %L', relid::pg_catalog.regclass, reason),
      HINT = 'fencekit counts rejections itself (fencekit.reject).';
  END IF;
  PERFORM pg_catalog.nextval(
    pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':' || reason)));
END
$fn$;

-- Count a rejection: its reason's counter, the reason's last rejection time (epoch ms) and,
-- for a stale token, the largest gap below the fence. Called by fencekit.reject only (as its
-- owner: writers hold no rights on these).
CREATE OR REPLACE FUNCTION fencekit.count_rejection(tag text, reason text, gap bigint)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  seq regclass := pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':' || reason));
  at_seq regclass := pg_catalog.to_regclass(
    pg_catalog.format('fencekit.%I', tag || ':last_at:' || reason));
  cur bigint;
BEGIN
  IF seq IS NULL THEN
    RETURN;  -- table protected by a template without this counter; never fail a write over it
  END IF;
  PERFORM pg_catalog.nextval(seq);
  IF at_seq IS NOT NULL THEN
    PERFORM pg_catalog.setval(at_seq,
      (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint);
  END IF;
  IF reason = 'stale' AND gap IS NOT NULL AND gap > 0 THEN
    cur := fencekit.counter_value(tag, 'max_gap');
    IF cur IS NULL OR gap > cur THEN
      -- Not atomic with the read: two concurrent rejections may keep the smaller gap. A gauge.
      PERFORM pg_catalog.setval(pg_catalog.format('fencekit.%I', tag || ':max_gap')::regclass, gap);
    END IF;
  END IF;
END
$fn$;

-- Keep the worst lateness (ms) seen for a table in its max_late_ms gauge, a sequence like the
-- counters so that it survives the rollback of the rejected write. Not atomic with the read:
-- two concurrent rejections may keep the smaller value. Called by fencekit.reject only.
CREATE OR REPLACE FUNCTION fencekit.record_lateness(tag text, late_ms bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  seq regclass := pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':max_late_ms'));
  cur bigint;
BEGIN
  IF seq IS NULL OR late_ms IS NULL OR late_ms < 1 THEN
    RETURN;  -- a sequence cannot hold 0
  END IF;
  cur := fencekit.counter_value(tag, 'max_late_ms');
  IF cur IS NULL OR late_ms > cur THEN
    PERFORM pg_catalog.setval(seq, late_ms);
  END IF;
END
$fn$;

-- The primary key values of a row, for messages: {"col": "value", ...}, or NULL without a key.
CREATE OR REPLACE FUNCTION fencekit.row_key(relid oid, row_data jsonb) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.jsonb_object_agg(a.attname, row_data ->> a.attname::text)
    FROM pg_catalog.pg_index i
    JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
   WHERE i.indrelid = relid AND i.indisprimary
$fn$;

-- Count a rejection and raise its error. Never returns.
--
-- Trusted surface (docs/security.md): SECURITY DEFINER because a rejection is counted in
-- sequences that writers must not write (nextval on the reason's counter, setval on the
-- last_at / max_gap / max_late_ms gauges: a writer with those rights could forge or reset
-- them), and its lateness reads fencekit.fences, which writers cannot read. It touches only
-- those sequences (fencekit."<tag>:<counter>"), one row of fencekit.fences, and the catalogs
-- (pg_class, pg_namespace for the message; pg_locks, pg_trigger, pg_proc in
-- fencekit.writing). It acts only for a transaction writing the table it names
-- (fencekit.writing). It never runs caller code: it reads no user table, casts no user type
-- (the key arrives as jsonb built by the caller's trigger and is only printed, with jsonb's
-- own output function), and every function and operator it calls is pg_catalog's or
-- fencekit's own, under a pinned search_path.
CREATE OR REPLACE FUNCTION fencekit.reject(
  reason text, tag text, relid oid, trigger_name text, column_name text, resource text,
  key jsonb, token bigint, fence bigint, extra text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  sch text;
  tbl text;
  what text;
  code text;
  msg text;
  hint text;
  late_ms bigint;
  held text;
BEGIN
  IF NOT fencekit.writing(tag, relid) THEN
    PERFORM fencekit.refuse_caller(tag, relid, 'fencekit.reject');
  END IF;
  -- Lateness of a stale or reused token on a key or table fence: the time since the fence last
  -- advanced (updated_at: the start of the transaction that raised it to its current value,
  -- which is at or above this token). Row fences keep no time per row: NULL.
  IF reason IN ('stale', 'reused') AND resource IS NOT NULL THEN
    SELECT pg_catalog.round(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()
                                                          - f.updated_at) * 1000)::bigint
      INTO late_ms
      FROM fencekit.fences f
     WHERE f.resource = reject.resource
       AND f.key = COALESCE((SELECT e.value FROM pg_catalog.jsonb_each_text(reject.key) e
                              LIMIT 1), '');
    late_ms := GREATEST(late_ms, 0);
  END IF;
  SELECT n.nspname, c.relname INTO sch, tbl
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
   WHERE c.oid = relid;
  what := pg_catalog.format('%I.%I', sch, tbl)
          || CASE WHEN key IS NULL THEN '' ELSE ' key ' || key::text END;
  PERFORM fencekit.count_rejection(tag, reason, fence - token);
  IF late_ms IS NOT NULL THEN
    PERFORM fencekit.record_lateness(tag, late_ms);
  END IF;
  CASE reason
  WHEN 'stale' THEN
    code := 'YF001';
    msg := pg_catalog.format('fencekit: stale write to %s: token %s is lower than the fence %s',
                             what, token, fence);
    hint := 'A newer holder took over this resource. Stop this work; acquire the lease again '
            'and re-read before writing.';
    -- A token that is a live lease of fencekit's own issuer is the current holder's (its tokens
    -- never repeat): a fence above it is ahead of the issuer (the issuer was restored or reset,
    -- or another issuer fed this resource), not a newer holder. Only this slow path reads it.
    SELECT l.resource INTO held FROM fencekit.leases l
     WHERE l.token = reject.token AND l.holder IS NOT NULL
       AND l.expires_at > pg_catalog.clock_timestamp()
     LIMIT 1;
    IF held IS NOT NULL THEN
      msg := msg || pg_catalog.format(', yet it is the live lease of %s', held);
      hint := pg_catalog.format(
        'The fence is ahead of the issuer: token %s is the current lease of %s, but the fence '
        'is %s (the issuer was restored or reset, or another issuer fed this resource). A '
        'member of fencekit_admin repairs it: fencekit fence set %s%s --to %s --allow-lower; '
        'or advance the issuer past %s.',
        token, held, fence, pg_catalog.format('%I.%I', sch, tbl),
        COALESCE((SELECT pg_catalog.string_agg(' --key ' || e.value, ''
                                               ORDER BY e.ordinality)
                    FROM pg_catalog.jsonb_each_text(reject.key) WITH ORDINALITY e), ''),
        token, fence);
    END IF;
  WHEN 'reused' THEN
    code := 'YF002';
    msg := pg_catalog.format('fencekit: token %s was already used on %s, which accepts each token once',
                             token, what);
    hint := 'Acquire a new lease (a new token) for each write, or protect the table with on_equal = accept.';
  WHEN 'missing' THEN
    code := 'YF003';
    msg := pg_catalog.format('fencekit: write to %s without a fencing token', what);
    hint := 'Set the token in the same transaction as the write: SELECT '
            'set_config(''fencekit.token'', ''<token>'', true). fencekit''s Python adapters '
            'send it for a write inside a lease or a fencekit.fencing(token) scope.';
  WHEN 'malformed' THEN
    code := 'YF004';
    IF token IS NULL THEN
      msg := pg_catalog.format('fencekit: malformed fencing token %L for %s', extra, what);
      hint := 'A token is a positive integer within bigint, written in plain decimal (e.g. ''34'').';
    ELSE
      -- A row check read a valid token other than the one its statement was checked under
      -- (extra; '' for none): code that ran during the statement changed fencekit.token.
      msg := pg_catalog.format(
        'fencekit: fencekit.token changed during the statement on %s: '
        'checked as %L, then read as %s',
        what, extra, token);
      hint := 'Set fencekit.token before the statement and leave it alone while the statement '
              'runs: a trigger or function that sets it (fencekit status reports the table''s) '
              'must not run inside a fenced write.';
    END IF;
  WHEN 'bypass_refused' THEN
    code := 'YF005';
    msg := pg_catalog.format('fencekit: role %I may not bypass fencing on %s',
                             COALESCE(extra, current_user::text), what);
    hint := 'Only members of fencekit_admin may set fencekit.bypass; a DBA grants it: GRANT fencekit_admin TO <role>;';
  WHEN 'lease_mismatch' THEN
    code := 'YF006';
    msg := pg_catalog.format('fencekit: token %s is not the current lease token (%s) of resource %s on %s',
                             token, COALESCE(fence::text, 'no lease'), resource, what);
    hint := 'The lease was lost or never held. Acquire the lease again before writing.';
  WHEN 'issuer_mismatch' THEN
    code := 'YF007';
    msg := pg_catalog.format('fencekit: %s takes tokens from issuer %L, but the token came from %L',
                             what, extra, pg_catalog.current_setting('fencekit.issuer', true));
    hint := 'Tokens of different issuers are never comparable: use the issuer this resource is bound to.';
  ELSE
    code := 'YF000';
    msg := pg_catalog.format('fencekit: %s (on %s)', COALESCE(extra, reason), what);
    -- Every rejection says what to do (contracts.md), usage errors too.
    hint := 'Not a stale write: a fencekit setting or the protected table is used wrongly; fix '
            'what the message names and retry.';
  END CASE;
  RAISE EXCEPTION USING
    ERRCODE = code,
    MESSAGE = msg,
    DETAIL = pg_catalog.json_build_object(
      'reason', reason, 'table', pg_catalog.format('%s.%s', sch, tbl), 'key', key,
      'resource', resource, 'token', token, 'fence', fence,
      'late_ms', late_ms)::text,
    HINT = COALESCE(hint, ''),
    SCHEMA = COALESCE(sch, ''),
    TABLE = COALESCE(tbl, ''),
    COLUMN = COALESCE(column_name, ''),
    CONSTRAINT = COALESCE(trigger_name, '');
END
$fn$;

-- Rejected and let-through writes per protected table and reason; every column of a row is
-- about that row's reason (docs/errors-and-metrics.md): last_rejected_at is the reason's own
-- (NULL for 'unfenced' and 'bypassed', which are not rejections), max_token_gap is on the
-- 'stale' row only (the fence minus the lowest stale token seen).
CREATE OR REPLACE VIEW fencekit.rejections AS
SELECT p.schema_name, p.table_name, r.reason,
       COALESCE(fencekit.counter_value(p.tag, r.reason), 0) AS count,
       pg_catalog.to_timestamp(fencekit.counter_value(p.tag, 'last_at:' || r.reason) / 1000.0)
         AS last_rejected_at,
       CASE WHEN r.reason = 'stale' THEN fencekit.counter_value(p.tag, 'max_gap') END
         AS max_token_gap
  FROM fencekit.protected p
 CROSS JOIN LATERAL pg_catalog.unnest(fencekit.counter_reasons()) AS r(reason);
GRANT SELECT ON fencekit.rejections TO PUBLIC;

REVOKE ALL ON FUNCTION fencekit.create_counters(text), fencekit.drop_counters(text) FROM PUBLIC;
-- A member of fencekit_admin who owns a table may protect it: the script creates its counters.
GRANT EXECUTE ON FUNCTION fencekit.create_counters(text), fencekit.drop_counters(text)
  TO fencekit_admin;
REVOKE ALL ON FUNCTION fencekit.writing(text, oid), fencekit.refuse_caller(text, oid, text),
  fencekit.record_lateness(text, bigint), fencekit.count_rejection(text, text, bigint)
  FROM PUBLIC;
-- Writers need no grant: the triggers run as the writer and call these. count_event runs as
-- the writer (what it may count: create_counters); reject acts only for a transaction writing
-- the table it names (fencekit.writing).
GRANT EXECUTE ON FUNCTION fencekit.count_event(text, oid, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.reject(text, text, oid, text, text, text, jsonb, bigint, bigint, text)
  TO PUBLIC;
