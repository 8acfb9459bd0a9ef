-- A protected table that is dropped leaves its registry row (fencekit.protected) and its
-- counters behind; `fencekit status` then reports table_missing, and a new table created under
-- the old name would be protected over the old entry and its counts. An application that drops
-- and re-creates its tables (an uninstall and install of a queue's schema) wants neither: this
-- event trigger forgets the table when it is dropped. The fences stay (a fence is never
-- lowered): a new table of the same name on an unnamed key or table fence starts above every
-- token the old one accepted, which tokens from fencekit's issuer always are.
--
-- Trusted surface (docs/security.md): SECURITY DEFINER because the role that drops a table (its
-- owner) may not write fencekit.protected nor drop the counters. It touches only
-- pg_event_trigger_dropped_objects(), the catalogs pg_class, pg_trigger and pg_proc, one row of
-- fencekit.protected and the table's counter sequences (fencekit."<tag>:<counter>"). It acts
-- only for a registered table that this command dropped, matched by oid (the dropped object's
-- objid is the registry's table_oid, recorded at protect), never by name: a protected table's
-- owner may rename it and create and drop another table under its old name, which forgets
-- nothing. The oid counts only while the recorded oids hold (fencekit.recorded_oids_hold): a
-- restore gives every table another oid and copies the registry's, and a table owner can
-- create tables until one of its own gets a stale one. It also keeps a row whose registered
-- name a live relation has (that table may be the protected one, its recorded oid stale), and
-- a row whose generated trigger functions a remaining table's trigger still calls (nobody but
-- their owner and fencekit_admin may attach them). It never runs caller
-- code: no user table, type, cast or operator; oids and names are compared with pg_catalog's
-- operators. It cannot be called: it returns event_trigger.
CREATE OR REPLACE FUNCTION fencekit.forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  p record;
BEGIN
  FOR p IN
    SELECT pr.tag
      FROM pg_catalog.pg_event_trigger_dropped_objects() o
      JOIN fencekit.protected pr ON pr.table_oid OPERATOR(pg_catalog.=) o.objid
     WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
       AND o.objsubid OPERATOR(pg_catalog.=) 0
       AND o.object_type OPERATOR(pg_catalog.=) 'table'
       AND fencekit.recorded_oids_hold(pr.tag)
       AND pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name))
           IS NULL
       AND NOT EXISTS (
         SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc f ON f.oid = t.tgfoid
          WHERE f.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace
            AND f.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY[
                  pr.tag || '_ins', pr.tag || '_upd', pr.tag || '_del', pr.tag || '_stmt',
                  pr.tag || '_trunc']))
  LOOP
    DELETE FROM fencekit.protected WHERE tag OPERATOR(pg_catalog.=) p.tag;
    PERFORM fencekit.drop_counters(p.tag);
  END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION fencekit.forget_dropped_tables() FROM PUBLIC;

-- Event triggers need a superuser (or a managed service's equivalent role): installed only
-- when the installer is one; otherwise the install says so and goes on.
DO $do$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger
                  WHERE evtname = 'fencekit_forget_dropped') THEN
    CREATE EVENT TRIGGER fencekit_forget_dropped ON sql_drop
      WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
      EXECUTE FUNCTION fencekit.forget_dropped_tables();
  END IF;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE USING
    MESSAGE = 'fencekit: dropped protected tables are not forgotten automatically: the event '
              'trigger that does it needs a superuser',
    HINT = 'Re-run the install as a superuser (or your provider''s equivalent role) to add it; '
           'without it, after dropping a protected table, unprotect it or delete its '
           'fencekit.protected row (fencekit status reports it as table_missing).';
END
$do$;
