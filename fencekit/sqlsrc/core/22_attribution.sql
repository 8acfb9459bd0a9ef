-- Attribution of unfenced writes: who still writes a protected table without a token while it
-- is in rollout mode (on_missing = allow), so that switching it to reject is not a leap of
-- faith (`fencekit rollout`, docs/rollout.md).
--
-- A writer is a table, the session's login role (session_user), the role it acts as (SET
-- ROLE, else the login role: current_user at the top level), application_name, the client
-- address and the statement: its fingerprint (a hash of the top-level statement with literals
-- replaced), its query id when the server computes one (compute_query_id), and its text with
-- literals replaced (the text itself only when a member of fencekit_admin opts in).
--
-- Bounded by design:
-- - at most `attribution_cap` writers per table (fencekit.meta, default 50); statements of
--   writers beyond it are counted in fencekit.unfenced_overflow;
-- - no hot row: a backend remembers what it recorded in session settings (fencekit.seen_*)
--   and writes a writer's row at most once per 10 seconds per statement it runs; a row
--   another transaction is recording is skipped (pg_try_advisory_xact_lock), never waited
--   for, and its statements counted as unattributed (the table's sequences
--   '<tag>:unattributed' and '<tag>:last_at:unattributed'): any role can take that lock, so a
--   busy record must never lose a write from the report, and a sequence neither waits nor is
--   a row others lock;
-- - writers cannot erase or rewrite another writer's row: only fencekit.record_unfenced_writer
--   writes these tables for a writer, and only the row of the identity it reads from the
--   session itself.
--
-- Never a serialization failure. The record is made in the writer's own transaction, so a
-- statement rolled back is not attributed. A transaction at READ COMMITTED updates its
-- writer's row directly (fencekit.merge_unfenced_writer): each of its statements sees what
-- others committed, and the advisory lock keeps two recorders of one row from waiting on each
-- other. A transaction at REPEATABLE READ or SERIALIZABLE cannot do that: updating a row that
-- another transaction recorded after its snapshot fails it with 40001 (concurrent update), and
-- at SERIALIZABLE the reads of a record (the writer's row, how many writers the table has)
-- take predicate locks that make concurrent recorders read-write conflicts, so one of them
-- fails at commit. Attribution must never make an application retry. So such a transaction
-- appends to fencekit.unfenced_log instead: one INSERT into a table without an index, which
-- nothing in a writer's transaction reads (no row lock, no unique check, no predicate lock a
-- writer could meet), and the table's sequences, which are outside transactions and
-- predicate locking alike: '<tag>:logged' numbers the appends, '<tag>:last_at:logged' keeps
-- the time of the last. No advisory lock is taken on that path. The report side folds the
-- log into fencekit.unfenced_writers with the same code as the direct record
-- (fencekit.fold_unfenced_log: `fencekit rollout`, and the enforce gates through it), and
-- fencekit.unfenced_writer_totals counts rows not yet folded.
-- The log is bounded by construction: an append numbered more than attribution_log_cap()
-- beyond the number the last fold reached (fencekit.unfenced_log_folded) is not written but
-- counted as unattributed (never lost from the report), so the log holds at most that many
-- rows per table appended since the last fold, plus the rows of transactions still open at
-- that fold. That mark is a row, not a sequence: a fold rolled back (a refused migration)
-- leaves its rows in the log and must leave the mark where it was. Only a fold writes it,
-- never at SERIALIZABLE, so a SERIALIZABLE writer's read of it meets no conflict. A reader
-- at SERIALIZABLE would hold a predicate lock on the log that every append meets: the fold
-- refuses to run at that level, and the totals view reads the log only below it (at
-- SERIALIZABLE it counts the appends since the last fold, a rolled-back one too). What a
-- transaction at those levels reads besides: that mark, the catalogs (not predicate-locked)
-- and fencekit.meta's literals switch (a predicate lock that only a SERIALIZABLE transaction
-- writing fencekit.meta, a DBA's, meets). READ COMMITTED keeps the direct record: the report
-- needs no fold for it, and its cost is what it was (the inline test of the generated checks
-- is the same for every level).
--
-- The count of a writer is coarse (see fencekit.attribute: a statement repeated with parameters
-- counts once per period per backend); the last time a writer was seen is the commit of the
-- last transaction that recorded it (the deferred triggers below fencekit.fold_unfenced_log),
-- at most 10 seconds behind its statements otherwise (fencekit.attribution_lag).
-- fencekit.rejections' 'unfenced' counter stays the exact count of statements allowed without
-- a token, on every scope.

CREATE TABLE IF NOT EXISTS fencekit.unfenced_writers (
  tag               text NOT NULL,
  writer            text NOT NULL,  -- md5 of the identity below
  session_user_name text NOT NULL,
  current_user_name text NOT NULL,
  application_name  text NOT NULL,
  client_addr       inet,
  query_id          bigint,
  fingerprint       text NOT NULL,
  statement         text NOT NULL,
  first_seen        timestamptz NOT NULL,
  last_seen         timestamptz NOT NULL,
  statements        bigint NOT NULL,
  PRIMARY KEY (tag, writer)
);

CREATE TABLE IF NOT EXISTS fencekit.unfenced_overflow (
  tag        text PRIMARY KEY,
  first_seen timestamptz NOT NULL,
  last_seen  timestamptz NOT NULL,
  statements bigint NOT NULL
);

-- What transactions at REPEATABLE READ or SERIALIZABLE record (one row per record, with the
-- writer's identity as in unfenced_writers), until a fold moves it there. Append-only for
-- writers, and no index: an INSERT meets no unique check and no other transaction's lock.
CREATE TABLE IF NOT EXISTS fencekit.unfenced_log (
  tag               text NOT NULL,
  writer            text NOT NULL,
  session_user_name text NOT NULL,
  current_user_name text NOT NULL,
  application_name  text NOT NULL,
  client_addr       inet,
  query_id          bigint,
  fingerprint       text NOT NULL,
  statement         text NOT NULL,
  seen              timestamptz NOT NULL,
  statements        bigint NOT NULL
);

-- Per table, the number of appends to the log ('<tag>:logged') the last committed fold read
-- up to: the log's cap counts from it. Written by fencekit.fold_unfenced_log only.
CREATE TABLE IF NOT EXISTS fencekit.unfenced_log_folded (
  tag     text PRIMARY KEY,
  appends bigint NOT NULL
);

-- Statements and client identities are the application's: only fencekit_admin reads them
-- (the totals below are public, for metrics).
REVOKE ALL ON fencekit.unfenced_writers, fencekit.unfenced_overflow, fencekit.unfenced_log,
  fencekit.unfenced_log_folded FROM PUBLIC;
GRANT ALL ON fencekit.unfenced_writers, fencekit.unfenced_overflow, fencekit.unfenced_log,
  fencekit.unfenced_log_folded TO fencekit_admin;

-- How far a writer's last_seen may lag its last statement: a backend records a statement it
-- has recorded within this many seconds only by counting it in a session setting.
CREATE OR REPLACE FUNCTION fencekit.attribution_lag() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT 10
$fn$;

-- How many appends to fencekit.unfenced_log a table may have beyond the last fold's mark: a
-- constant, so that an append reads no table for it (an append carries at most 2,000
-- characters of statement: at most about 20 MB per table until the next fold).
CREATE OR REPLACE FUNCTION fencekit.attribution_log_cap() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT 10000
$fn$;

-- A statement's text with every literal replaced by '?': quoted strings, numbers and comments
-- go; an IN list of placeholders becomes one. Anything it cannot lex for sure (a backslash,
-- which E'' strings and standard_conforming_strings = off use as an escape, a dollar quote, a
-- nested comment, an unterminated quote) ends the text there with '...', so that no literal
-- is ever kept. Its
-- patterns are E'' strings: PL/pgSQL reads a function's literals when a session first runs it,
-- under that session's standard_conforming_strings, and off, a backslash in a '' string would
-- be an escape (a pattern turned invalid, and the tokenless write it attributes failed).
CREATE OR REPLACE FUNCTION fencekit.statement_shape(q text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  s text := q;
  cut integer;
  odd text;
BEGIN
  IF s IS NULL THEN
    RETURN '';
  END IF;
  -- A dollar sign not starting a parameter ($1) may open a dollar quote.
  cut := pg_catalog.strpos(pg_catalog.regexp_replace(s, E'\\$[0-9]', '__', 'g'), '$');
  IF pg_catalog.strpos(s, E'\\') > 0
     AND (cut = 0 OR pg_catalog.strpos(s, E'\\') < cut) THEN
    cut := pg_catalog.strpos(s, E'\\');
  END IF;
  -- A block comment nested in another (PostgreSQL's ends at the outer */, the pass below's
  -- at the first) is not lexed below either: cut there.
  odd := pg_catalog.substring(s, E'/\\*(?:[^*]|\\*+[^*/])*/\\*');
  IF odd IS NOT NULL AND (cut = 0 OR pg_catalog.strpos(s, odd) < cut) THEN
    cut := pg_catalog.strpos(s, odd);
  END IF;
  IF cut > 0 THEN
    s := pg_catalog.left(s, cut - 1) || ' ...';
  END IF;
  -- One left-to-right pass: a quote inside a comment or a quoted identifier ("o'x") is
  -- theirs, a comment marker inside a string the string's. A quoted identifier is kept (with
  -- a '?' after it, taken off next: the replacement is one for every kind of match).
  s := pg_catalog.regexp_replace(s,
         E'("(?:[^"]|"")*")|''(?:[^'']|'''')*''|--[^\\n]*|/\\*(?:[^*]|\\*+[^*/])*\\*+/'
         '|(?<!\\$)\\m[0-9][0-9A-Za-z_.]*',  -- continues the E'' string: its escapes too
         E'\\1?', 'g');
  s := pg_catalog.regexp_replace(s, E'("(?:[^"]|"")*")\\?', E'\\1', 'g');
  -- A quote left outside the quoted identifiers opened a string that did not end: cut at the
  -- first quote (one inside an identifier before it only makes the shape shorter).
  IF pg_catalog.strpos(pg_catalog.regexp_replace(s, '"(?:[^"]|"")*"', '', 'g'), '''') > 0 THEN
    s := pg_catalog.left(s, pg_catalog.strpos(s, '''') - 1) || ' ...';
  END IF;
  s := pg_catalog.regexp_replace(s, E'\\?(\\s*,\\s*\\?)+', '?, ...', 'g');
  s := pg_catalog.btrim(pg_catalog.regexp_replace(s, E'\\s+', ' ', 'g'));
  RETURN pg_catalog.left(s, 2000);
END
$fn$;

-- Count `statements` tokenless statements of the table protected under `tag` whose writer
-- could not be recorded, and their time `at`: sequences (fencekit.counter_names), which
-- neither wait nor roll back, so a busy record costs no row lock and a hostile lock holder
-- blocks nothing. The count is approximate (nextval and setval are two steps); the time never
-- goes back (another caller's older time must not hide a later unattributed write). Called
-- by fencekit.record_unfenced_writer (the clock's time, never a statement's start: a CALL
-- that commits runs for hours) and fencekit.merge_unfenced_writer (a record's last_seen).
CREATE OR REPLACE FUNCTION fencekit.count_unattributed(tag text, statements bigint,
                                                       at timestamptz)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  seq regclass := pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':unattributed'));
  at_seq regclass := pg_catalog.to_regclass(
    pg_catalog.format('fencekit.%I', tag || ':last_at:unattributed'));
BEGIN
  IF seq IS NULL OR at_seq IS NULL OR statements IS NULL OR statements < 1 THEN
    RETURN;  -- table protected by a template without these counters
  END IF;
  -- Saturating: never within a billion of the sequence's maximum, where nextval would fail
  -- every later writer's statement (the count a caller passes is at most a billion).
  PERFORM pg_catalog.setval(seq, LEAST(pg_catalog.nextval(seq), 9223372036854775807 - 2000000000)
                                 + LEAST(statements, 1000000000) - 1);
  PERFORM pg_catalog.setval(at_seq, GREATEST(
    COALESCE(pg_catalog.pg_sequence_last_value(at_seq), 0),
    (pg_catalog.date_part('epoch', COALESCE(at, pg_catalog.clock_timestamp())) * 1000)::bigint));
END
$fn$;
REVOKE ALL ON FUNCTION fencekit.count_unattributed(text, bigint, timestamptz) FROM PUBLIC;

-- Add one record `r` (a writer's identity, statement, first and last seen and a count) to
-- fencekit.unfenced_writers: its row's times and count grow, or a new row is made while the
-- table has fewer than `attribution_cap` writers, else the statements go to the table's
-- overflow row (directly for a record without a writer: a fold's sum of writers beyond the
-- cap). The one way a record enters those tables: fencekit.record_unfenced_writer's at READ
-- COMMITTED, and fencekit.fold_unfenced_log's for what the other levels appended. When
-- another transaction holds the writer's (or the overflow's) advisory lock, which any role can
-- take, the statements are counted as unattributed instead (fencekit.count_unattributed), so
-- that `fencekit rollout` still sees them. False when the record went to the overflow (the
-- table's writers are at the cap). Runs as its caller: record_unfenced_writer's owner, or a
-- member of fencekit_admin folding; nobody else may run it.
CREATE OR REPLACE FUNCTION fencekit.merge_unfenced_writer(r fencekit.unfenced_writers)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  cap integer;
  n integer;
  -- The sums below saturate, so no count can overflow and fail another writer's statement.
  add bigint := GREATEST(COALESCE(r.statements, 1), 1);
BEGIN
  IF r.writer IS NOT NULL THEN
    -- One recorder per writer at a time; the others skip rather than wait behind its
    -- transaction. The first key is fencekit's class of advisory locks ('fencekit.attribution').
    IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('fencekit.attribution'),
                                                pg_catalog.hashtext(r.tag || ' ' || r.writer)) THEN
      PERFORM fencekit.count_unattributed(r.tag, add, r.last_seen);
      RETURN true;
    END IF;
    UPDATE fencekit.unfenced_writers u
       SET first_seen = LEAST(u.first_seen, r.first_seen),
           last_seen = GREATEST(u.last_seen, r.last_seen),
           statements = LEAST(u.statements, 9223372036854775807 - add) + add,
           query_id = COALESCE(r.query_id, u.query_id)
     WHERE u.tag = r.tag AND u.writer = r.writer;
    IF FOUND THEN
      RETURN true;
    END IF;
    SELECT pg_catalog.int4(m.value) INTO cap FROM fencekit.meta m
     WHERE m.key = 'attribution_cap' AND m.value ~ '^[0-9]{1,9}$';
    SELECT pg_catalog.count(*) INTO n FROM fencekit.unfenced_writers u WHERE u.tag = r.tag;
    IF n < COALESCE(cap, 50) THEN
      r.statements := add;
      INSERT INTO fencekit.unfenced_writers SELECT (r).*
      ON CONFLICT ON CONSTRAINT unfenced_writers_pkey DO NOTHING;
      RETURN true;
    END IF;
  END IF;
  IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('fencekit.attribution'),
                                              pg_catalog.hashtext(r.tag)) THEN
    PERFORM fencekit.count_unattributed(r.tag, add, r.last_seen);
    RETURN false;
  END IF;
  INSERT INTO fencekit.unfenced_overflow AS o (tag, first_seen, last_seen, statements)
  VALUES (r.tag, r.first_seen, r.last_seen, add)
  ON CONFLICT ON CONSTRAINT unfenced_overflow_pkey DO UPDATE
    SET first_seen = LEAST(o.first_seen, excluded.first_seen),
        last_seen = GREATEST(o.last_seen, excluded.last_seen),
        statements = LEAST(o.statements, 9223372036854775807 - excluded.statements)
                     + excluded.statements;
  RETURN false;
END
$fn$;
REVOKE ALL ON FUNCTION fencekit.merge_unfenced_writer(fencekit.unfenced_writers) FROM PUBLIC;

-- Record the session's current statement as an unfenced writer of the table protected under
-- `tag`, adding `statements` to its count: at READ COMMITTED into its row
-- (fencekit.merge_unfenced_writer), at REPEATABLE READ or SERIALIZABLE as one row appended to
-- fencekit.unfenced_log (see the top of this file: no read of the writers' tables or the log,
-- no lock another transaction holds or waits for), or, beyond the log's cap, counted as
-- unattributed.
-- Always true: the caller's count is spent.
--
-- Trusted surface (docs/security.md): SECURITY DEFINER because it writes
-- fencekit.unfenced_writers, fencekit.unfenced_overflow and fencekit.unfenced_log and the
-- table's attribution sequences ('<tag>:logged', '<tag>:last_at:logged', '<tag>:unattributed',
-- '<tag>:last_at:unattributed'), which writers may not write (they could erase or rewrite
-- other writers' rows, or hide their own). It acts only for a role that may write the table
-- it names, or a transaction writing it (fencekit.writing), and records only the identity it
-- reads itself from the session (session_user, fencekit.session_role(), application_name,
-- inet_client_addr(), current_query(), pg_stat_get_activity for the query id): a caller
-- chooses none of it but the table and a count. It reads fencekit.meta,
-- fencekit.unfenced_log_folded and the catalogs (pg_locks, pg_trigger, pg_proc through
-- fencekit.writing), names no user relation, casts no user type, and every function and
-- operator it calls is pg_catalog's or fencekit's under a pinned search_path: nothing of the
-- table owner's runs in it.
CREATE OR REPLACE FUNCTION fencekit.record_unfenced_writer(tag text, relid oid, statements bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
DECLARE
  q text := pg_catalog.current_query();
  shape text := fencekit.statement_shape(q);
  fp text := pg_catalog.md5(shape);
  su text := session_user;
  cu text := fencekit.session_role();
  app text := COALESCE(pg_catalog.current_setting('application_name', true), '');
  addr inet := pg_catalog.inet_client_addr();
  w text;
  qid bigint;
  stmt text;
  logged regclass;
  n bigint;
  -- The time now: statement_timestamp() stays at the start of a CALL, across its COMMITs,
  -- and of a message holding several statements.
  seen timestamptz := pg_catalog.clock_timestamp();
BEGIN
  IF statements IS NULL OR statements < 1 THEN
    RETURN true;
  END IF;
  -- The count is the caller's (a session's own settings): at most a billion a call, and the
  -- sums saturate, so no count can overflow and fail another writer's statement.
  statements := LEAST(statements, 1000000000);
  -- A role that may write the table could as well write it without a token: its own rows
  -- are all it can add. Anyone else must be writing it now (a cascade, a definer function):
  -- only then is the server's lock table read, so a plain writer's cost never depends on the
  -- locks other sessions hold.
  -- Either way relid must be the table protected as tag (it carries tag's generated triggers,
  -- which only their owner or fencekit_admin can attach): a right to write some other table
  -- (a TEMP table of one's own) records nothing for tag.
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                   JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid
                  WHERE t.tgrelid OPERATOR(pg_catalog.=) relid
                    AND p.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace::pg_catalog.oid
                    -- not '_trunc': a row fence's TRUNCATE check is its owner's, to put anywhere
                    AND p.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY[tag || '_ins', tag || '_upd',
                                                tag || '_del', tag || '_stmt']))
     OR (NOT pg_catalog.has_table_privilege(cu, relid, 'INSERT, UPDATE, DELETE, TRUNCATE')
         AND NOT fencekit.writing(tag, relid)) THEN
    PERFORM fencekit.refuse_caller(tag, relid, 'fencekit.record_unfenced_writer');
  END IF;
  w := pg_catalog.md5(pg_catalog.concat_ws(E'\x1f', su, cu, app,
                                           pg_catalog.host(addr), fp));
  SELECT a.query_id INTO qid
    FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a;
  stmt := CASE WHEN EXISTS (SELECT FROM fencekit.meta m
                             WHERE m.key = 'attribution_literals' AND m.value = 'on')
               THEN pg_catalog.left(q, 2000) ELSE shape END;
  -- READ UNCOMMITTED is READ COMMITTED in PostgreSQL.
  IF pg_catalog.current_setting('transaction_isolation')
       NOT IN ('repeatable read', 'serializable') THEN
    PERFORM fencekit.merge_unfenced_writer(
      ROW(tag, w, su, cu, app, addr, qid, fp, stmt, seen, seen, statements)
        ::fencekit.unfenced_writers);
    RETURN true;
  END IF;
  -- REPEATABLE READ or SERIALIZABLE: append, within the log's cap past the last fold's mark.
  logged := pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':logged'));
  IF logged IS NOT NULL THEN
    n := pg_catalog.nextval(logged) - COALESCE((SELECT f.appends FROM fencekit.unfenced_log_folded f
                                                WHERE f.tag = record_unfenced_writer.tag), 0);
  END IF;
  IF n IS NULL OR n > fencekit.attribution_log_cap() THEN
    PERFORM fencekit.count_unattributed(tag, statements, seen);
    RETURN true;
  END IF;
  INSERT INTO fencekit.unfenced_log
         (tag, writer, session_user_name, current_user_name, application_name, client_addr,
          query_id, fingerprint, statement, seen, statements)
  VALUES (tag, w, su, cu, app, addr, qid, fp, stmt, seen, statements);
  -- For a SERIALIZABLE reader of the totals, which does not read the log (the top of this
  -- file): when the last append since the last fold was made. Never back.
  PERFORM pg_catalog.setval(
    pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':last_at:logged')),
    GREATEST(COALESCE(fencekit.counter_value(tag, 'last_at:logged'), 0),
             (pg_catalog.date_part('epoch', seen) * 1000)::bigint));
  RETURN true;
END
$fn$;

-- Fold what transactions at REPEATABLE READ or SERIALIZABLE appended to fencekit.unfenced_log
-- for the tables protected under `tags` (NULL: every table) into fencekit.unfenced_writers:
-- the rows committed so far are taken out of the log and added per writer (first and last
-- seen, the count summed) through fencekit.merge_unfenced_writer, the direct record's own
-- code (same cap, same overflow, a busy advisory lock counted as unattributed), and each
-- table's mark (fencekit.unfenced_log_folded) moves to the appends numbered before the fold
-- read the log, which frees the log's cap when the fold commits. Rows of transactions still
-- open stay for the next fold.
-- `fencekit rollout` and the enforce gates run it before they read the writers
-- (fencekit.catalog.rollout).
--
-- Its advisory locks are bounded like the table it writes: per table, the writers the log
-- holds that have a row already come first, then new ones until the cap is reached; the rest
-- go to the overflow as one record. So a fold takes about `attribution_cap` + 2 locks per
-- table however many writers (application names, say) the log names: the server's lock table
-- is shared, and a fold must not fill it.
--
-- Returns false, and reads nothing, in a SERIALIZABLE transaction (its read of the log would
-- take a predicate lock that every SERIALIZABLE writer's append meets, making the writer part
-- of read-write conflicts it never had), a REPEATABLE READ one (a writer's row recorded after
-- its snapshot would fail the fold, and the migration running it, with 40001) or a read-only
-- one (a standby): run it in a read-write transaction at READ COMMITTED. The enforce gates
-- then judge by fencekit.unfenced_writer_totals, which counts the log.
--
-- Runs as its caller, a member of fencekit_admin (it deletes from the log and writes the
-- writers' tables and the folded marks, which only fencekit_admin may); it reads only
-- fencekit's tables and sequences, built-in types, with a pinned search_path.
CREATE OR REPLACE FUNCTION fencekit.fold_unfenced_log(tags text[]) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET fencekit.folding = 'on' AS $fn$
DECLARE
  marks text[];
  uptos bigint[];
  records fencekit.unfenced_writers[];
  r fencekit.unfenced_writers;
  spill fencekit.unfenced_writers;  -- the table's writers beyond the cap, as one record
  spilled boolean := false;         -- (a row IS NULL only when every field is)
  this text;
  room boolean;
BEGIN
  IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable')
     OR pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    RETURN false;
  END IF;
  -- The number of each table's last append, read before the log: every append numbered up to
  -- it is read below, or belongs to a transaction still open, whose row stays.
  SELECT pg_catalog.array_agg(p.tag), pg_catalog.array_agg(fencekit.counter_value(p.tag, 'logged'))
    INTO marks, uptos
    FROM fencekit.protected p WHERE tags IS NULL OR p.tag = ANY (tags);
  WITH gone AS (
    DELETE FROM fencekit.unfenced_log l WHERE tags IS NULL OR l.tag = ANY (tags) RETURNING l.*
  ), per_writer AS (
    -- A writer's identity is the same in each of its rows (the writer is its hash): the
    -- first record's statement (the text itself differs when literals are kept; a commit
    -- marker carries none), the last query id known, the last time seen (a marker's: the
    -- commit of the writer's transaction), the records' count (a marker counts 0).
    SELECT g.tag, g.writer, pg_catalog.min(g.session_user_name) AS su,
           pg_catalog.min(g.current_user_name) AS cu, pg_catalog.min(g.application_name) AS app,
           pg_catalog.min(g.client_addr) AS addr, pg_catalog.min(g.fingerprint) AS fp,
           COALESCE((pg_catalog.array_agg(g.statement ORDER BY g.seen)
                       FILTER (WHERE g.statements > 0))[1], '') AS stmt,
           (pg_catalog.array_agg(g.query_id ORDER BY g.seen DESC)
              FILTER (WHERE g.query_id IS NOT NULL))[1] AS qid,
           pg_catalog.min(g.seen) AS first_at, pg_catalog.max(g.seen) AS last_at,
           LEAST(pg_catalog.sum(g.statements), 9223372036854775807)::bigint AS n
      FROM gone g GROUP BY g.tag, g.writer
  )
  SELECT pg_catalog.array_agg(ROW(w.tag, w.writer, w.su, w.cu, w.app, w.addr, w.qid, w.fp,
                                  w.stmt, w.first_at, w.last_at, w.n)::fencekit.unfenced_writers
           ORDER BY w.tag,
                    EXISTS (SELECT FROM fencekit.unfenced_writers u
                             WHERE u.tag = w.tag AND u.writer = w.writer) DESC,
                    w.first_at, w.writer)
    INTO records FROM per_writer w;
  FOREACH r IN ARRAY COALESCE(records, '{}') LOOP
    IF r.tag IS DISTINCT FROM this THEN
      IF spilled THEN
        PERFORM fencekit.merge_unfenced_writer(spill);
      END IF;
      this := r.tag;
      room := true;
      spilled := false;
    END IF;
    IF room THEN
      room := fencekit.merge_unfenced_writer(r);
    ELSIF NOT spilled THEN
      spill := r;
      spill.writer := NULL;
      spilled := true;
    ELSE
      spill.first_seen := LEAST(spill.first_seen, r.first_seen);
      spill.last_seen := GREATEST(spill.last_seen, r.last_seen);
      spill.statements := LEAST(spill.statements, 9223372036854775807 - r.statements)
                          + r.statements;
    END IF;
  END LOOP;
  IF spilled THEN
    PERFORM fencekit.merge_unfenced_writer(spill);
  END IF;
  INSERT INTO fencekit.unfenced_log_folded AS f (tag, appends)
  SELECT m.tag, m.appends
    FROM ROWS FROM (pg_catalog.unnest(marks), pg_catalog.unnest(uptos)) AS m(tag, appends)
   WHERE m.appends IS NOT NULL
  ON CONFLICT ON CONSTRAINT unfenced_log_folded_pkey DO UPDATE
    SET appends = GREATEST(f.appends, excluded.appends);
  RETURN true;
END
$fn$;
REVOKE ALL ON FUNCTION fencekit.fold_unfenced_log(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.fold_unfenced_log(text[]),
  fencekit.merge_unfenced_writer(fencekit.unfenced_writers),
  fencekit.count_unattributed(text, bigint, timestamptz) TO fencekit_admin;

-- A writer is last seen when its transaction commits, not when its statement ran: the record
-- becomes visible at the commit, and a transaction that wrote without a token an hour before
-- its commit must not look an hour old to `fencekit rollout` (which would call the table
-- ready to enforce the moment that transaction commits). Deferred constraint triggers do it:
-- - fencekit.unfenced_writers and fencekit.unfenced_overflow (the direct record, READ
--   COMMITTED): a row inserted, or updated with a count (UPDATE OF statements, which the
--   trigger's own update of last_seen is not, so it does not fire again), gets
--   last_seen = GREATEST(last_seen, clock_timestamp()) at commit (never back: the overflow row
--   is shared). The row is the writer's own (or its table's overflow), which its record
--   already locked: the update waits for nobody. One more write per record (at most once per
--   statement per 10 seconds per backend), none on the per-statement inline test.
-- - fencekit.unfenced_log (REPEATABLE READ, SERIALIZABLE): an append gets, at commit, a
--   marker appended beside it (the same writer, no statement text, statements 0,
--   seen = clock_timestamp()); the fold takes a writer's last time seen from its newest row
--   and sums the counts (a marker adds 0). An append, not an update: nothing in a writer's
--   transaction may read the log (an UPDATE scans it: row locks and, at SERIALIZABLE,
--   predicate locks other writers' appends meet, 40001). Markers are one per append, so the
--   log holds at most twice attribution_log_cap() rows per table past the last fold. The
--   marker also moves '<tag>:last_at:logged' (what a SERIALIZABLE reader of the totals sees).
-- A fold (fencekit.fold_unfenced_log) writes the writers' tables in an admin's transaction,
-- whose commit is not the writer's: it runs with fencekit.folding = 'on', which the triggers'
-- WHEN tests, so its records keep the times the log holds. A writer that sets that setting
-- itself only keeps its own last_seen at its statement's time, never moves another's. What
-- fires at commit also fires:
-- - at PREPARE TRANSACTION (two-phase commit), not at COMMIT PREPARED: a prepared
--   transaction is seen at its prepare, so the window must cover the time transactions stay
--   prepared (docs/rollout.md);
-- - at the end of a statement after SET CONSTRAINTS ALL IMMEDIATE (or the trigger's name):
--   only the writer's own row is dated then, earlier than its commit;
-- - at each COMMIT of a procedure (a CALL that commits), for what it recorded since.
-- Limits: statements counted as unattributed (a busy record, a full log) are timed at the
-- statement (sequences have no commit); a transaction whose statements were all recorded
-- earlier in the same 10-second period by the same backend (fencekit.attribute records
-- nothing then) is seen at that earlier record's commit.
--
-- The three trigger functions below are one trusted surface (docs/security.md): SECURITY
-- DEFINER because a writer may not write these tables (only fencekit.record_unfenced_writer
-- does, for it), and the triggers fire in the writer's transaction, as the writer. Each
-- touches only the row of fencekit's table whose insert or update fired it (by its key,
-- last_seen only), or appends one row to fencekit.unfenced_log (NEW's identity) and moves the
-- table's sequence '<tag>:last_at:logged'. Never runs: anything of a table owner's. They fire
-- only on fencekit's own tables, to which no table owner can attach a trigger, rule, policy or
-- default (00_guard.sql refuses any but these); they name no user relation, cast no user
-- type, and call only pg_catalog's functions and operators under a pinned search_path, on
-- built-in types. A trigger function cannot be called directly.
CREATE OR REPLACE FUNCTION fencekit.unfenced_writer_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  UPDATE fencekit.unfenced_writers u
     SET last_seen = GREATEST(u.last_seen, pg_catalog.clock_timestamp())
   WHERE u.tag = NEW.tag AND u.writer = NEW.writer;
  RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION fencekit.unfenced_overflow_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  UPDATE fencekit.unfenced_overflow o
     SET last_seen = GREATEST(o.last_seen, pg_catalog.clock_timestamp())
   WHERE o.tag = NEW.tag;
  RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION fencekit.unfenced_log_commit_marker() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  at timestamptz := pg_catalog.clock_timestamp();
  at_seq regclass := pg_catalog.to_regclass(
    pg_catalog.format('fencekit.%I', NEW.tag || ':last_at:logged'));
BEGIN
  INSERT INTO fencekit.unfenced_log
         (tag, writer, session_user_name, current_user_name, application_name, client_addr,
          query_id, fingerprint, statement, seen, statements)
  VALUES (NEW.tag, NEW.writer, NEW.session_user_name, NEW.current_user_name,
          NEW.application_name, NEW.client_addr, NEW.query_id, NEW.fingerprint, '', at, 0);
  IF at_seq IS NOT NULL THEN
    PERFORM pg_catalog.setval(at_seq, GREATEST(
      COALESCE(pg_catalog.pg_sequence_last_value(at_seq), 0),
      (pg_catalog.date_part('epoch', at) * 1000)::bigint));
  END IF;
  RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION fencekit.unfenced_writer_at_commit(), fencekit.unfenced_overflow_at_commit(),
  fencekit.unfenced_log_commit_marker() FROM PUBLIC;

-- Each trigger is named as its function (00_guard.sql accepts exactly these). Constraint
-- triggers have no CREATE OR REPLACE.
DROP TRIGGER IF EXISTS unfenced_writer_at_commit ON fencekit.unfenced_writers;
CREATE CONSTRAINT TRIGGER unfenced_writer_at_commit
  AFTER INSERT OR UPDATE OF statements ON fencekit.unfenced_writers
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (COALESCE(pg_catalog.current_setting('fencekit.folding', true), '')
          OPERATOR(pg_catalog.<>) 'on')
  EXECUTE FUNCTION fencekit.unfenced_writer_at_commit();
DROP TRIGGER IF EXISTS unfenced_overflow_at_commit ON fencekit.unfenced_overflow;
CREATE CONSTRAINT TRIGGER unfenced_overflow_at_commit
  AFTER INSERT OR UPDATE OF statements ON fencekit.unfenced_overflow
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (COALESCE(pg_catalog.current_setting('fencekit.folding', true), '')
          OPERATOR(pg_catalog.<>) 'on')
  EXECUTE FUNCTION fencekit.unfenced_overflow_at_commit();
-- Not for its own markers (statements 0).
DROP TRIGGER IF EXISTS unfenced_log_commit_marker ON fencekit.unfenced_log;
CREATE CONSTRAINT TRIGGER unfenced_log_commit_marker
  AFTER INSERT ON fencekit.unfenced_log
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.statements OPERATOR(pg_catalog.>) 0)
  EXECUTE FUNCTION fencekit.unfenced_log_commit_marker();

-- Attribute an unfenced write: the part of it the generated checks of a table protected with
-- on_missing = allow do not do inline (sqlgen's attribute(), which runs once per statement
-- that goes on without a token: a row fence's check before the statement, a key fence's after
-- it, a table fence's before it; TRUNCATE's). Runs as its caller and writes nothing but
-- session settings, except when the statement is new to this backend or was last recorded in
-- an earlier 10-second period (attribution_lag()): then fencekit.record_unfenced_writer
-- records it. A bypassed write is not attributed (it is audited as 'bypassed').
--
-- What a backend remembers, in session settings named by the session's identity and a
-- statement key: fencekit.seen_<tag>_<hash> = the 10-second period (epoch / 10) in which it
-- last recorded the statement. Two keys: the exact text of the top-level statement (clients
-- that send parameters, $1, repeat it; the check tests it inline, writes nothing on a hit, and
-- calls this only for a new statement or period), and on a miss a coarse one, the text before
-- its first quote or digit (clients that write literals into the text), which also keeps a
-- count, fencekit.pending_<tag>_<hash>: the statements under it since its last record.
-- Statements that share a coarse key are recorded, one per period, in turn; one can wait
-- behind another only while that other keeps writing without a token, so a table never looks
-- ready early. A statement counted under a coarse key makes no setting of its own.
--
-- So a writer's count is coarse: statements repeated with parameters count one for each
-- period in which a backend ran them (the inline test counts nothing, which is what keeps it
-- cheap), statements with literals each count one; fencekit.rejections' 'unfenced' counter
-- stays the exact total. A session that sets these settings itself hides only its own
-- statements; 'unfenced' still counts them.
--
-- Written like the generated hot path: no SET clause (a function's `SET search_path` costs
-- more than the rest of it), every function, operator and type qualified, its one pattern
-- free of backslashes (read alike under any standard_conforming_strings). The period (10 s)
-- is written in, for the same reason; attribution_lag() says it.
CREATE OR REPLACE FUNCTION fencekit.attribute(tag pg_catalog.text, relid pg_catalog.oid)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
  period pg_catalog.text :=
    (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())::pg_catalog.int8
       OPERATOR(pg_catalog./) 10)::pg_catalog.text;
  who pg_catalog.text := pg_catalog.concat_ws(E'\x1f', session_user,
    pg_catalog.current_setting('role'), pg_catalog.current_setting('application_name'));
  q pg_catalog.text := pg_catalog.current_query();
  -- The inline test's key: the same identity and text, hashed alike.
  key pg_catalog.text := tag OPERATOR(pg_catalog.||) '_' OPERATOR(pg_catalog.||)
    pg_catalog.to_hex(pg_catalog.hashtext(pg_catalog.concat_ws(E'\x1f', who, q)));
  coarse pg_catalog.text;
  pending pg_catalog.int8 := 1;
  v pg_catalog.text;
BEGIN
  IF COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') OPERATOR(pg_catalog.<>) ''
     AND fencekit.bypass_allowed(tag, relid, NULL) THEN
    RETURN;
  END IF;
  IF pg_catalog.current_setting('fencekit.seen_' OPERATOR(pg_catalog.||) key, true)
       OPERATOR(pg_catalog.=) period THEN
    RETURN;  -- recorded in this period
  END IF;
  -- The text before the first quote or digit.
  coarse := tag OPERATOR(pg_catalog.||) '_' OPERATOR(pg_catalog.||)
    pg_catalog.to_hex(pg_catalog.hashtext(pg_catalog.concat_ws(E'\x1f', who,
    pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(
    pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(
    pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(q, '''', 1),
    '0', 1), '1', 1), '2', 1), '3', 1), '4', 1), '5', 1), '6', 1), '7', 1), '8', 1), '9', 1))));
  IF coarse OPERATOR(pg_catalog.<>) key THEN
    v := pg_catalog.current_setting('fencekit.pending_' OPERATOR(pg_catalog.||) coarse, true);
    IF v OPERATOR(pg_catalog.~) '^[0-9]{1,10}$' THEN
      pending := pending OPERATOR(pg_catalog.+) v::pg_catalog.int8;
    END IF;
    IF pg_catalog.current_setting('fencekit.seen_' OPERATOR(pg_catalog.||) coarse, true)
         OPERATOR(pg_catalog.=) period THEN
      -- Recorded in this period under the coarse key: counted there.
      PERFORM pg_catalog.set_config('fencekit.pending_' OPERATOR(pg_catalog.||) coarse,
        LEAST(pending, 1000000000)::pg_catalog.text, false);
      RETURN;
    END IF;
    PERFORM pg_catalog.set_config('fencekit.seen_' OPERATOR(pg_catalog.||) coarse, period, false);
    PERFORM pg_catalog.set_config('fencekit.pending_' OPERATOR(pg_catalog.||) coarse, '0', false);
  END IF;
  -- Recorded, or counted as unattributed: either way the count is spent.
  PERFORM fencekit.record_unfenced_writer(tag, relid, pending);
  PERFORM pg_catalog.set_config('fencekit.seen_' OPERATOR(pg_catalog.||) key, period, false);
END
$fn$;

-- Per protected table: how many writers wrote without a token, and when the last one did
-- (last_seen + attribution_lag() bounds the last unfenced statement), counting statements
-- whose writer could not be recorded (unattributed_statements). Public, for metrics:
-- counts and times only, no identities. It counts what fencekit.unfenced_log holds that no
-- fold has moved yet (its writers, before a fold applies the cap; its last time), except in a
-- SERIALIZABLE transaction, where reading the log would take a predicate lock that
-- SERIALIZABLE writers' appends meet (the top of this file): there last_seen counts the time
-- of the last append since the last fold instead ('<tag>:last_at:logged' while '<tag>:logged'
-- is past fencekit.unfenced_log_folded's mark; one rolled back too), and writers only the
-- folded ones. The test of the isolation is a constant of the query, so the log is not
-- scanned at all at that level.
CREATE OR REPLACE VIEW fencekit.unfenced_writer_totals AS
WITH logged AS (  -- one scan of the log for every table (it has no index)
  SELECT l.tag, pg_catalog.max(l.seen) AS last_seen,
         pg_catalog.array_agg(DISTINCT l.writer) AS writers
    FROM fencekit.unfenced_log l
   WHERE pg_catalog.current_setting('transaction_isolation') <> 'serializable'
   GROUP BY l.tag
)
SELECT p.schema_name, p.table_name, p.spec ->> 'on_missing' AS on_missing,
       (SELECT pg_catalog.count(*)
          FROM (SELECT u.writer FROM fencekit.unfenced_writers u WHERE u.tag = p.tag
                UNION
                SELECT pg_catalog.unnest(g.writers)) w)
         AS writers,
       COALESCE((SELECT o.statements FROM fencekit.unfenced_overflow o WHERE o.tag = p.tag), 0)
         AS overflow_statements,
       GREATEST((SELECT pg_catalog.max(u.last_seen) FROM fencekit.unfenced_writers u
                  WHERE u.tag = p.tag),
                (SELECT o.last_seen FROM fencekit.unfenced_overflow o WHERE o.tag = p.tag),
                pg_catalog.to_timestamp(fencekit.counter_value(p.tag, 'last_at:unattributed')
                                        / 1000.0),
                g.last_seen,
                -- Whether or not a fold has taken it in since: an append of a transaction
                -- open at the last fold stays in the log, numbered below the fold's mark.
                CASE WHEN pg_catalog.current_setting('transaction_isolation') = 'serializable'
                     THEN pg_catalog.to_timestamp(fencekit.counter_value(p.tag, 'last_at:logged')
                                                  / 1000.0)
                END)
         AS last_seen,
       COALESCE(fencekit.counter_value(p.tag, 'unattributed'), 0) AS unattributed_statements
  FROM fencekit.protected p
  LEFT JOIN logged g ON g.tag = p.tag;
GRANT SELECT ON fencekit.unfenced_writer_totals TO PUBLIC;

-- Writers need no grant for the rest: the generated checks run as the writer (row fences) and
-- call attribute, which calls record_unfenced_writer; that acts only for a transaction writing
-- the table it names.
GRANT EXECUTE ON FUNCTION fencekit.record_unfenced_writer(text, oid, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.attribute(pg_catalog.text, pg_catalog.oid) TO PUBLIC;
