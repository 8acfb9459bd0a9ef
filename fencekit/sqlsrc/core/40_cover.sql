-- Partitions and inheritance children created after protect. Protect covers the descendants a
-- table has when it runs (fencekit.<tag>_cover()); a child created or attached later has no
-- fencekit statement triggers (and, for an inheritance child, no row triggers) until protect is
-- re-run, and `fencekit status` reports it. With auto-cover on, an event trigger covers it at
-- once, in the transaction that creates it.

-- It acts only on what the command touched (pg_event_trigger_ddl_commands): a protected table
-- that is, or is an ancestor of, a table the command created or altered, and that has a
-- descendant without the table's fencekit triggers; it refuses a foreign table made a
-- descendant of one (fencekit.refuse_foreign_descendant), and a generated key column whose
-- expression changed since protect (fencekit.check_key_expressions). Any other DDL (a
-- temporary table, an unrelated table, a protected table's new column) covers nothing, so it
-- never fails for a role that may not run a cover function. It runs as the role that ran the command (no SECURITY
-- DEFINER): the cover function creates triggers with that role's rights, and runs no user code.
-- A protected table is found as fencekit.protected_table finds it (the oid protect recorded;
-- after a restore, a trigger of the table's that only an admin can attach), else by its
-- registered name: renamed, it is still the protected table. Its cover function names it by
-- the registered name, so a renamed table's new descendant is refused until `fencekit rename`
-- moves the protection (fail closed).
CREATE OR REPLACE FUNCTION fencekit.cover_new_children() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  p record;
  touched oid[];
  cover regprocedure;
BEGIN
  SELECT pg_catalog.array_agg(DISTINCT c.objid) INTO touched
    FROM pg_catalog.pg_event_trigger_ddl_commands() c
   WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.objsubid = 0;
  IF touched IS NULL THEN
    RETURN;
  END IF;
  FOR p IN
    WITH RECURSIVE up(relid, top) AS (
           SELECT t, t FROM pg_catalog.unnest(touched) AS t
           UNION
           SELECT i.inhparent, up.top FROM pg_catalog.pg_inherits i JOIN up ON i.inhrelid = up.relid),
         mine AS (
           SELECT DISTINCT pr.tag, pr.schema_name, pr.table_name, r.rel,
                  r.rel IS DISTINCT FROM named AS renamed
             FROM fencekit.protected pr
            CROSS JOIN LATERAL pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name,
                                                                        pr.table_name)) AS named
            CROSS JOIN LATERAL (
              SELECT COALESCE(fencekit.protected_table(pr.tag), named) AS rel) AS r
            WHERE r.rel IN (SELECT up.relid FROM up))
    SELECT m.tag, m.schema_name, m.table_name, m.rel, m.renamed, EXISTS (
       WITH RECURSIVE down(relid) AS (
              SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = m.rel
              UNION
              SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN down ON i.inhparent = down.relid)
       SELECT FROM down JOIN pg_catalog.pg_class c ON c.oid = down.relid
        WHERE c.relkind IN ('r', 'p')  -- what the cover function covers
          -- covered: a trigger the cover put there (not a partition's clone of a row trigger)
          -- calling one of the table's functions that only an admin can attach (not judged
          -- by a trigger's name, nor by the TRUNCATE check its owner owns)
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger g
                            JOIN pg_catalog.pg_proc f ON f.oid = g.tgfoid
                           WHERE g.tgrelid = down.relid AND g.tgparentid = 0
                             AND f.pronamespace = 'fencekit'::pg_catalog.regnamespace
                             AND f.proname IN (m.tag || '_ins', m.tag || '_stmt'))) AS uncovered
      FROM mine m
     ORDER BY m.schema_name, m.table_name
  LOOP
    -- Fail closed: a foreign table in a protected tree is written unfenced.
    PERFORM fencekit.refuse_foreign_descendant(p.rel);
    -- And a generated key column's new expression (SET EXPRESSION, 17+) rewrote the rows' keys
    -- without a trigger: refused here, in its own transaction (status reports it otherwise).
    PERFORM fencekit.check_key_expressions(p.rel);
    CONTINUE WHEN NOT p.uncovered;
    IF p.renamed THEN
      -- Fail closed: the cover function names the table by its registered name.
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: protected table %I.%I was renamed to %s: its '
                                    'triggers cannot be put on its new partition or child until '
                                    'the protection moves to the new name', p.schema_name,
                                    p.table_name, p.rel),
        HINT = pg_catalog.format('Run fencekit rename %I.%I %s (or rename the table back) '
                                 'first, then create or attach the partition or child.',
                                 p.schema_name, p.table_name, p.rel);
    END IF;
    cover := pg_catalog.to_regprocedure(pg_catalog.format('fencekit.%I()', p.tag || '_cover'));
    CONTINUE WHEN cover IS NULL;
    BEGIN
      -- dynamic SQL: each protected table has its own cover function (a regprocedure: quoted)
      EXECUTE pg_catalog.format('SELECT %s', cover);
    EXCEPTION WHEN insufficient_privilege THEN
      -- Fail closed: a child that would be written unfenced is not created.
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: cannot put the triggers of protected table %I.%I '
                                    'on its new partition or child: %s', p.schema_name,
                                    p.table_name, SQLERRM),
        HINT = 'Create it as the role that protected the table (a member of fencekit_admin), '
               'or turn auto-cover off (fencekit auto-cover off) and re-run protect.';
    END;
  END LOOP;
END
$fn$;

-- Turn auto-cover on or off. Event triggers need a superuser (or a managed service's
-- equivalent role); anyone else gets fencekit's error saying so.
-- The commands that can make a table a child or partition: CREATE TABLE (INHERITS, PARTITION
-- OF), ALTER TABLE (INHERIT, ATTACH PARTITION), CREATE SCHEMA, whose CREATE TABLE elements
-- fire no CREATE TABLE event of their own (pg_event_trigger_ddl_commands lists them under it),
-- and CREATE and ALTER FOREIGN TABLE, which auto-cover refuses in a protected tree.
-- Turning it on again replaces a trigger that listens to fewer commands.
CREATE OR REPLACE FUNCTION fencekit.set_auto_cover(enabled boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF enabled AND NOT EXISTS (
       SELECT FROM pg_catalog.pg_event_trigger
        WHERE evtname = 'fencekit_auto_cover' AND evtevent = 'ddl_command_end'
          AND evtfoid = 'fencekit.cover_new_children()'::pg_catalog.regprocedure
          AND evttags::text[] @> ARRAY['CREATE TABLE', 'ALTER TABLE', 'CREATE SCHEMA',
                                       'CREATE FOREIGN TABLE', 'ALTER FOREIGN TABLE']) THEN
    DROP EVENT TRIGGER IF EXISTS fencekit_auto_cover;
    CREATE EVENT TRIGGER fencekit_auto_cover ON ddl_command_end
      WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE SCHEMA', 'CREATE FOREIGN TABLE',
                   'ALTER FOREIGN TABLE')
      EXECUTE FUNCTION fencekit.cover_new_children();
  ELSIF NOT enabled THEN
    DROP EVENT TRIGGER IF EXISTS fencekit_auto_cover;
  END IF;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE EXCEPTION USING ERRCODE = 'YF000',
    MESSAGE = 'fencekit: auto-cover needs an event trigger, which only a superuser may create '
              'or drop: ' || SQLERRM,
    HINT = 'Run it as a superuser (or your provider''s equivalent role), or leave it off: '
           're-run protect after creating a partition or child; fencekit status reports one '
           'that is not covered.';
END
$fn$;

REVOKE ALL ON FUNCTION fencekit.set_auto_cover(boolean) FROM PUBLIC;
