-- What a protect script runs to put a table's objects in place (fencekit/sqlgen/protect.py),
-- written once here instead of in every script. SECURITY INVOKER: they run as whoever runs
-- protect or the cover function, with that role's rights; anyone may call them, and they can
-- do nothing the caller could not do with the DDL they run.

-- Make trigger `name` on `rel` the one `definition` creates (a CREATE OR REPLACE TRIGGER whose
-- only format placeholder, %s, is the table), stamped `stamp`: replaced whatever is there, since
-- a trigger of that name and stamp may be another of fencekit's that the table's owner renamed
-- and stamped (the owner may comment its own triggers, and stamps are no secret).
CREATE OR REPLACE FUNCTION fencekit.ensure_trigger(rel regclass, name text, stamp text,
                                                   definition text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- dynamic SQL: the trigger definition and its table come from the caller (a regclass, quoted)
  EXECUTE pg_catalog.format(definition, rel);
  EXECUTE pg_catalog.format('COMMENT ON TRIGGER %I ON %s IS %L', name, rel, stamp);
END
$fn$;

-- Whether `name` is one of the names of the table whose objects' names start `prefix` (its
-- 'fencekit_<tag>_' or '<tag>_'): it starts with it, and the rest is not another table's tag
-- and suffix. A tag ends in '_' and ten hex digits (ident.py), so a table named '<tag>_x'
-- has the tag '<tag>_x_<hash>' and the objects '<tag>_x_<hash>_ins': their rest holds ten hex
-- digits and a '_', which no suffix of fencekit's does. Without this, one table's re-protect
-- or unprotect dropped the other's triggers and functions, or failed on them.
CREATE OR REPLACE FUNCTION fencekit.named_by(name text, prefix text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.starts_with(name, prefix)
     AND pg_catalog.substr(name, pg_catalog.length(prefix) + 1) !~ '(^|_)[0-9a-f]{10}_'
$fn$;

-- ------------------------------------------------------------------ which table is protected
-- A protected table is known by two things, neither enough alone: the oid protect recorded
-- (fencekit.protected.table_oid), which a rename keeps and a restore does not, and the triggers
-- protect put on it, which its owner may drop, and whose names any table owner may give to a
-- trigger of its own.

-- Whether the relation `rel` carries a trigger of the protected table `tag` that only an admin
-- can put there: named fencekit_<tag>_* and calling one of the table's generated functions
-- that the role which ran protect owns and that only it and fencekit_admin may execute (every
-- one but a row fence's TRUNCATE check, <tag>_trunc, which the table's owner owns and may
-- attach to any table of its own). Reads the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.carries_tag(rel oid, for_tag text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT EXISTS (
    SELECT FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc f ON f.oid = g.tgfoid
     WHERE g.tgrelid = rel AND NOT g.tgisinternal
       AND fencekit.named_by(g.tgname::text, 'fencekit_' || for_tag || '_')
       AND f.pronamespace = 'fencekit'::regnamespace
       AND fencekit.named_by(f.proname::text, for_tag || '_')
       AND f.proname::text <> for_tag || '_trunc')
$fn$;

-- The cluster's system identifier, which initdb makes anew and a dump does not carry; NULL
-- where pg_control_system is not granted (the oids are then judged by function_oid alone).
CREATE OR REPLACE FUNCTION fencekit.cluster_id() RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RETURN (SELECT c.system_identifier FROM pg_catalog.pg_control_system() c);
EXCEPTION WHEN insufficient_privilege THEN
  RETURN NULL;
END
$fn$;

-- Whether the oids fencekit.protected recorded for `tag` (table_oid, attnums, child_attnums)
-- are this database's: protect recorded them with function_oid, the oid of the table's
-- fencekit.<tag>_stmt, and that function still has it. A restore (pg_dump, pg_restore) creates
-- every table and function anew under other oids and copies the registry as it was: its
-- table_oid may then be no relation or any relation (oids are handed out in order: a table
-- owner can create tables until one of its own gets it), and its attnums count columns the
-- restore may have left out. Only the installer and superusers create functions in schema
-- fencekit, so nobody can give a function of that name the recorded oid. (pg_upgrade keeps the
-- relations' oids, not the functions': after it the oids count as stale, too, until protect
-- runs.) A restore into a fresh cluster hands out oids in the dump's order, which a table
-- owner can steer (functions and tables of its own, restored before fencekit's) until the
-- restored function and a table of its own get the recorded oids: so the oids count only in
-- the cluster that recorded them (cluster_id, fencekit.cluster_id), which initdb makes anew.
-- Reads the catalogs and fencekit.protected only.
CREATE OR REPLACE FUNCTION fencekit.recorded_oids_hold(for_tag text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT EXISTS (
    SELECT FROM fencekit.protected p JOIN pg_catalog.pg_proc f ON f.oid = p.function_oid
     WHERE p.tag = for_tag AND f.pronamespace = 'fencekit'::regnamespace
       AND f.proname::text = p.tag || '_stmt'
       AND p.cluster_id IS NOT DISTINCT FROM fencekit.cluster_id())
$fn$;

-- The protected table `tag` is, or NULL when the catalogs do not say. While the recorded oids
-- hold (fencekit.recorded_oids_hold): the table whose oid is table_oid, whatever it is named
-- now and whatever triggers it still carries (its owner may drop them, rename it away and put
-- another table under its name, with triggers of the same names); NULL once no table has that
-- oid (it was dropped). After a restore: the table that carries one of its triggers only an
-- admin can attach (fencekit.carries_tag), the one under its registered name first, then one
-- no ancestor of which carries it (a renamed table, not its partitions). Callers may take the
-- registered name when this is NULL: a table dropped and created again, or restored without
-- its triggers, which status reports. Reads the catalogs and fencekit.protected only.
CREATE OR REPLACE FUNCTION fencekit.protected_table(for_tag text) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT CASE WHEN fencekit.recorded_oids_hold(p.tag) THEN
           (SELECT c.oid::regclass FROM pg_catalog.pg_class c
             WHERE c.oid = p.table_oid AND c.relkind IN ('r', 'p'))
         ELSE
           (SELECT c.oid::regclass FROM pg_catalog.pg_class c
             WHERE c.relkind IN ('r', 'p')
               AND c.oid IN (SELECT g.tgrelid FROM pg_catalog.pg_trigger g
                              WHERE fencekit.named_by(g.tgname::text,
                                                      'fencekit_' || p.tag || '_'))
               AND fencekit.carries_tag(c.oid, p.tag)
               AND NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                                WHERE i.inhrelid = c.oid
                                  AND fencekit.carries_tag(i.inhparent, p.tag))
             ORDER BY c.oid IS DISTINCT FROM pg_catalog.to_regclass(
                        pg_catalog.format('%I.%I', p.schema_name, p.table_name)), c.oid
             LIMIT 1)
         END
    FROM fencekit.protected p WHERE p.tag = for_tag
$fn$;

-- Drop the triggers on `rel` named `prefix`* ('fencekit_<tag>_') that are not in `keep` (made
-- by another release of the template: re-protect must not leave an old one firing), and those
-- calling one of the table's functions ('<tag>_'*) under a name not in `keep` (an owner may
-- rename one of fencekit's triggers out of the prefix, which would keep it from unprotect). Clones PostgreSQL made on
-- partitions go with their parent's.
CREATE OR REPLACE FUNCTION fencekit.drop_other_triggers(rel regclass, prefix text, keep text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  old name;
BEGIN
  FOR old IN SELECT t.tgname FROM pg_catalog.pg_trigger t
               JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
              WHERE t.tgrelid = rel AND NOT t.tgisinternal AND t.tgparentid = 0
                AND (fencekit.named_by(t.tgname::text, prefix)
                     -- or one of the table's functions under another name (renamed)
                     OR (p.pronamespace = 'fencekit'::regnamespace
                         AND fencekit.named_by(p.proname::text,
                                               pg_catalog.substr(prefix, 10))))
                AND t.tgname::text <> ALL (keep) LOOP
    -- dynamic SQL: the table and trigger are known only at run time (quoted by format)
    EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', old, rel);
  END LOOP;
END
$fn$;

-- Drop the trigger functions fencekit.<prefix>* (no arguments) that are not in `keep`.
CREATE OR REPLACE FUNCTION fencekit.drop_other_functions(prefix text, keep text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  old name;
BEGIN
  FOR old IN SELECT p.proname FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'fencekit'::regnamespace AND p.pronargs = 0
                AND fencekit.named_by(p.proname::text, prefix)
                AND p.proname::text <> ALL (keep) LOOP
    -- dynamic SQL: the function is known only at run time (quoted by format)
    EXECUTE pg_catalog.format('DROP FUNCTION fencekit.%I()', old);
  END LOOP;
END
$fn$;

-- Every partition and inheritance child of `root`, at any depth (tables only: foreign ones take
-- no fencekit trigger), and whether it is a partition.
CREATE OR REPLACE FUNCTION fencekit.descendants(root regclass)
RETURNS TABLE (child regclass, is_partition boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  WITH RECURSIVE d(relid) AS (
    SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = root
    UNION
    SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.relid)
  SELECT c.oid::regclass, c.relispartition FROM d
    JOIN pg_catalog.pg_class c ON c.oid = d.relid WHERE c.relkind IN ('r', 'p')
$fn$;

-- The first foreign table among the partitions and inheritance children of `root`, at any
-- depth, or NULL. Its rows live on another server, where no fencekit trigger runs: a write
-- naming it is judged by nothing (writes through the root fail: PostgreSQL collects no
-- transition rows from a foreign child). So protect refuses such a tree, and so does
-- auto-cover a foreign table added to a protected one.
CREATE OR REPLACE FUNCTION fencekit.foreign_descendant(root regclass) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  WITH RECURSIVE d(relid) AS (
    SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = root
    UNION
    SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.relid)
  SELECT c.oid::regclass FROM d JOIN pg_catalog.pg_class c ON c.oid = d.relid
   WHERE c.relkind = 'f' ORDER BY c.oid LIMIT 1
$fn$;

-- Refuse `root`'s tree if it holds a foreign table (fencekit.foreign_descendant).
CREATE OR REPLACE FUNCTION fencekit.refuse_foreign_descendant(root regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  f regclass := fencekit.foreign_descendant(root);
BEGIN
  IF f IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s cannot be fenced: its partition or child %s is '
                                  'a foreign table, whose rows no fencekit trigger can check '
                                  '(they are written on another server); nothing was changed',
                                  root, f),
      HINT = 'Detach it (ALTER TABLE ... DETACH PARTITION, or NO INHERIT) and fence its rows '
             'where they are stored: protect the table on the server that holds them.';
  END IF;
END
$fn$;

-- What each protected table's fencekit.<tag>_cover() does first (protect runs it, and so does
-- the auto-cover event trigger when a child is created or attached later): drop from every
-- descendant of `root` the triggers named `prefix`* that are not in `keep`, the names its
-- template makes (another release made them). Clones PostgreSQL made go with their parent's.
-- A registered row fence first refuses a descendant whose fence column is not the one fencekit
-- bound there (fencekit.check_descendant_columns): covering it would bind the new column.
CREATE OR REPLACE FUNCTION fencekit.cover_descendants(root regclass, prefix text, keep text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  d record;
BEGIN
  FOR d IN SELECT p.spec ->> 'column' AS col FROM fencekit.protected p
            WHERE p.scope = 'row' AND 'fencekit_' || p.tag || '_' = prefix LOOP
    PERFORM fencekit.check_descendant_columns(root, d.col, prefix || 'ins');
  END LOOP;
  FOR d IN SELECT * FROM fencekit.descendants(root) LOOP
    PERFORM fencekit.drop_other_triggers(d.child, prefix, keep);
  END LOOP;
END
$fn$;

-- Then, for each of the table's triggers that its descendants need: put trigger `name`
-- (stamped `stamp`, made by `definition`, a CREATE TRIGGER whose only format placeholder is the
-- table) on every descendant of `root`: a statement trigger on each partition and child, a row
-- trigger (`on_rows`) on each inheritance child (PostgreSQL clones row triggers to partitions
-- itself). The definition is the generator's, passed by the generated function: never text
-- read back from the catalogs, where a trigger name the table's owner chose could turn the
-- text into other SQL.
CREATE OR REPLACE FUNCTION fencekit.cover_trigger(root regclass, name text, stamp text,
                                                  definition text, on_rows boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  d record;
BEGIN
  FOR d IN SELECT * FROM fencekit.descendants(root) LOOP
    IF NOT (on_rows AND d.is_partition) THEN
      PERFORM fencekit.ensure_trigger(d.child, name, stamp, definition);
    END IF;
  END LOOP;
END
$fn$;

-- Refuse (42501) fencekit's own DDL on `rel` (protect, unprotect, move, rename, re-protect)
-- when it would run code the table's owner defined in a session with more rights than the
-- owner. What that DDL does to a user table (ADD COLUMN bigint, SET DEFAULT, DROP COLUMN,
-- CREATE/DROP/COMMENT ON TRIGGER, RENAME, LOCK) is catalog work except in one place: on a
-- partitioned table, CREATE TRIGGER and DROP COLUMN load the partition key, and loading it
-- folds the constant parts of its expressions, which call whatever functions and operators the
-- owner wrote there, as the session's role. So: in a session logged in as the owner
-- (fencekit.session_is) anything goes (the owner's code runs as the owner); in any other, a
-- superuser's included, refuse when `rel` or a partitioned table under it has a partition key
-- that depends on a function, operator or type that is not built in. Reads the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.check_ddl_runs_no_owner_code(rel regclass)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  owner_oid oid;
  bad record;
BEGIN
  SELECT c.relowner INTO owner_oid FROM pg_catalog.pg_class c WHERE c.oid = rel;
  IF owner_oid IS NULL OR fencekit.session_is(owner_oid) THEN
    RETURN;
  END IF;
  WITH RECURSIVE tree(oid) AS (
         SELECT rel::oid
         UNION
         SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.oid)
  SELECT pt.partrelid::regclass AS partitioned,
         pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0) AS code
    INTO bad
    FROM tree
    JOIN pg_catalog.pg_partitioned_table pt ON pt.partrelid = tree.oid
    JOIN pg_catalog.pg_depend d
      ON d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = pt.partrelid
     AND d.objsubid = 0 AND d.deptype = 'n'
     AND d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass,
                          'pg_catalog.pg_type'::regclass)
     AND d.refobjid >= 16384
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = pg_catalog.format(
        'fencekit: refusing to change fencekit''s triggers or columns on %s in a session of %I: '
        'on the partitioned table %s that DDL loads the partition key, which evaluates %s (not '
        'built in: its owner''s code) with this session''s rights; nothing was changed', rel,
        session_user, bad.partitioned, bad.code),
      HINT = pg_catalog.format(
        'Take the owner''s code out of the partition key, or run the same command in a '
        'session logged in as the table''s owner %s: its code then runs with its own rights '
        '(protect and move also need CREATE on schema fencekit for that one command: grant it, '
        'then revoke it, and check fencekit status). SET ROLE is not enough: the owner''s code '
        'could RESET ROLE back to yours.', owner_oid::regrole);
  END IF;
END
$fn$;

-- Give `fn` (a protected table's generated function that reads the table: a row fence's
-- TRUNCATE check) to `rel`'s owner, so that reading the table runs its owner's code with the
-- owner's rights only. A superuser can always; another protector must be the owner or a member
-- of it (PostgreSQL's rule for ALTER ... OWNER TO), and refused, says what to do instead.
CREATE OR REPLACE FUNCTION fencekit.give_to_table_owner(fn regprocedure, rel regclass)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  owner_oid oid;
BEGIN
  SELECT c.relowner INTO owner_oid FROM pg_catalog.pg_class c WHERE c.oid = rel;
  IF (SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid = fn) = owner_oid THEN
    RETURN;
  END IF;
  BEGIN
    -- dynamic SQL: the function and the owner are known only at run time (quoted by format)
    EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', fn, owner_oid::regrole::text);
  EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = pg_catalog.format(
        'fencekit: %s reads %s and must belong to its owner %s, which %I cannot give it: %s',
        fn, rel, owner_oid::regrole, session_user, SQLERRM),
      HINT = 'Protect the table as a superuser.';
  END;
END
$fn$;

-- The attnum of each column a spec's objects read by name on `rel`, in order: a row fence's
-- fence column, a key fence's key columns; NULL for a table fence, and for a column `rel` lacks.
-- Attnums survive renames; a column added under a name another was renamed away from has a new
-- one. Reads pg_attribute only.
CREATE OR REPLACE FUNCTION fencekit.bound_attnums(rel regclass, spec jsonb) RETURNS int2[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT CASE WHEN spec ->> 'scope' IN ('row', 'key') THEN ARRAY(
           SELECT a.attnum
             FROM pg_catalog.jsonb_array_elements_text(
                    CASE spec ->> 'scope' WHEN 'row'
                      THEN pg_catalog.jsonb_build_array(spec -> 'column')
                      ELSE spec -> 'key' END) WITH ORDINALITY AS u(col, o)
             LEFT JOIN pg_catalog.pg_attribute a
               ON a.attrelid = rel AND a.attname = u.col AND a.attnum > 0
                  AND NOT a.attisdropped
            ORDER BY u.o) END
$fn$;

-- A row fence's fence column attnum on each partition and inheritance child of `rel` that has
-- it, as {child oid: attnum}; NULL for other scopes and for a table without descendants. Reads
-- the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.child_attnums(rel regclass, spec jsonb) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.jsonb_object_agg(d.child::oid::text, a.attnum)
    FROM fencekit.descendants(rel) d
    JOIN pg_catalog.pg_attribute a
      ON a.attrelid = d.child AND a.attname = spec ->> 'column' AND a.attnum > 0
         AND NOT a.attisdropped
   WHERE spec ->> 'scope' = 'row'
$fn$;

-- The columns of `rel` and of its partitions and inheritance children, at any depth, that
-- fencekit bound as the row fence column `col` and that are no longer named `col` there
-- (`was`: their name now). An owner can rename the fence column away and add another under the
-- name (an inheritance child: out of the tree, then back); fencekit's row triggers read the
-- new one by name. Three things bind the old column by attnum, so any one witnesses it: the
-- INSERT trigger `ins`'s WHEN clause (its pg_depend entry); the fence DEFAULT, which the
-- owner's RENAME leaves on the old column: a column other than `col` whose default is the one
-- on `col` of a relation of the tree (protect sets it on each; register_table checks again
-- after it did, should the owner have dropped it everywhere); and the child's attnum protect
-- recorded (fencekit.protected.child_attnums, while the recorded oids hold), which the owner
-- cannot strip. (While they hold, the protected table's own recorded attnum is compared by
-- fencekit.check_bound_columns instead, which says more.) Defaults are compared as pg_node_tree text
-- without parse locations (they vary with the text of the statement that set them): never
-- deparsed, never evaluated. Reads the catalogs and fencekit.protected only.
CREATE OR REPLACE FUNCTION fencekit.swapped_descendant_columns(rel regclass, col text, ins text)
RETURNS TABLE (child regclass, was name)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  WITH tree AS (SELECT rel::oid AS relid
                UNION ALL SELECT d.child::oid FROM fencekit.descendants(rel) d),
  fence AS (
    SELECT DISTINCT pg_catalog.regexp_replace(f.adbin::text, ' :location -?[0-9]+', '', 'g') AS e
      FROM tree t
      JOIN pg_catalog.pg_attribute a
        ON a.attrelid = t.relid AND a.attname = col AND NOT a.attisdropped
      JOIN pg_catalog.pg_attrdef f ON f.adrelid = a.attrelid AND f.adnum = a.attnum),
  recorded AS (
    SELECT r.key::oid AS relid, r.value::int2 AS attnum
      FROM fencekit.protected p
     CROSS JOIN pg_catalog.jsonb_each_text(p.child_attnums) AS r(key, value)
     WHERE 'fencekit_' || p.tag || '_ins' = ins AND p.table_oid = rel::oid
       AND fencekit.recorded_oids_hold(p.tag)),
  -- `rel` itself only while its recorded attnum cannot be compared (after a restore): else
  -- that says it, and a column an earlier protection bound (unprotected, then protected
  -- afresh) keeps a fence DEFAULT that binds nothing.
  checked AS (
    SELECT t.relid FROM tree t
     WHERE t.relid <> rel::oid
        OR EXISTS (SELECT FROM fencekit.protected p
                    WHERE 'fencekit_' || p.tag || '_ins' = ins
                      AND NOT fencekit.recorded_oids_hold(p.tag)))
  SELECT t.relid::regclass, a.attname
    FROM checked t
    JOIN pg_catalog.pg_attribute a
      ON a.attrelid = t.relid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> col
   WHERE EXISTS (SELECT FROM pg_catalog.pg_attrdef f
                  WHERE f.adrelid = t.relid AND f.adnum = a.attnum
                    AND pg_catalog.regexp_replace(f.adbin::text, ' :location -?[0-9]+', '', 'g')
                        IN (SELECT e FROM fence))
      OR EXISTS (SELECT FROM pg_catalog.pg_trigger g
                   JOIN pg_catalog.pg_depend d
                     ON d.classid = 'pg_catalog.pg_trigger'::regclass AND d.objid = g.oid
                    AND d.refclassid = 'pg_catalog.pg_class'::regclass
                    AND d.refobjid = t.relid AND d.refobjsubid = a.attnum
                  WHERE g.tgrelid = t.relid AND g.tgname = ins)
      OR EXISTS (SELECT FROM recorded r WHERE r.relid = t.relid AND r.attnum = a.attnum)
   ORDER BY t.relid, a.attnum
$fn$;

-- Refuse (YF000) to bind a row fence's objects on `rel` or its descendants to the column named
-- `col` where fencekit bound another (fencekit.swapped_descendant_columns).
CREATE OR REPLACE FUNCTION fencekit.check_descendant_columns(rel regclass, col text, ins text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  swapped record;
BEGIN
  SELECT * INTO swapped FROM fencekit.swapped_descendant_columns(rel, col, ins) LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: column %I of %s%s is not the column fencekit '
                                  'protected there: that one is now named %I', col,
                                  swapped.child, CASE WHEN swapped.child <> rel
                                                      THEN pg_catalog.format(' (under %s)', rel)
                                                      ELSE '' END, swapped.was),
      DETAIL = 'Protecting or covering it again would take the new column for the protected '
               'one: the fences kept with the old one would be lost.',
      HINT = pg_catalog.format('Put the protected column back under its name (an inheritance '
                               'child: NO INHERIT, rename both columns, INHERIT again; fencekit '
                               'status prints the statements), or unprotect %s and protect it '
                               'again (the fences restart).', rel),
      COLUMN = col;
  END IF;
END
$fn$;

-- The key columns of the key fence `tag` on `rel` that are not the columns fencekit bound
-- (`was`: the bound one's name now, NULL when none is left; `added`: whether a column has the
-- key column's name now): its trigger `_keys` names them in
-- its UPDATE OF list by attnum (pg_trigger.tgattr), and a rename leaves it on the old column,
-- so it witnesses a key column swapped after a restore too, when the attnums protect recorded
-- are another database's (callers consult it only then: while they hold, the recorded
-- attnums say more, and the trigger may merely have been replaced, which re-protect mends).
-- Only the trigger protect made (its name and the table's fencekit.<tag>_stmt, which only an
-- admin can attach) counts. Reads the catalogs only.
CREATE OR REPLACE FUNCTION fencekit.swapped_key_columns(rel regclass, spec jsonb, for_tag text)
RETURNS TABLE (col text, was name, added boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  WITH bound AS (
    SELECT g.tgattr::int2[] AS nums
      FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc f ON f.oid = g.tgfoid
     WHERE g.tgrelid = rel AND g.tgname = 'fencekit_' || for_tag || '_keys'
       AND f.pronamespace = 'fencekit'::regnamespace AND f.proname = for_tag || '_stmt'
       AND spec ->> 'scope' = 'key'
     LIMIT 1),
  named AS (
    SELECT u.col, u.o, a.attnum
      FROM pg_catalog.jsonb_array_elements_text(spec -> 'key') WITH ORDINALITY AS u(col, o)
      LEFT JOIN pg_catalog.pg_attribute a
        ON a.attrelid = rel AND a.attname = u.col AND a.attnum > 0 AND NOT a.attisdropped)
  SELECT n.col,
         (SELECT a.attname FROM pg_catalog.unnest(b.nums) AS x(num)
            JOIN pg_catalog.pg_attribute a ON a.attrelid = rel AND a.attnum = x.num
           WHERE x.num <> ALL (SELECT m.attnum FROM named m WHERE m.attnum IS NOT NULL)
           ORDER BY x.num LIMIT 1),
         n.attnum IS NOT NULL
    FROM bound b, named n
   WHERE n.attnum IS NULL OR n.attnum <> ALL (b.nums)
   ORDER BY n.o
$fn$;

-- Refuses (YF000) a protected table whose fence or key column is not the one protect recorded
-- (fencekit.protected.attnums, found by the table's oid whatever its name now, while the
-- recorded oids hold: fencekit.recorded_oids_hold): renamed away, with or without another
-- added under its name; and a row fence's table, partition or child whose fence column is
-- (fencekit.check_descendant_columns), or a key fence's (fencekit.swapped_key_columns): by
-- what binds the old column by attnum, which a restore keeps; the registry row is the one
-- whose protected table `rel` is, or whose name it has).
-- Protect would bind fencekit's objects to a new column (adding an empty one when none has the
-- name), a rename re-protects, and a move would carry its fences from there, while the fences
-- stay with the old column (a row fence's in it; a key fence's are named by its values). A
-- column dropped for good is not refused: its fences went with it (status:
-- fence_column_missing). Reads the catalogs and fencekit.protected only.
CREATE OR REPLACE FUNCTION fencekit.check_bound_columns(rel regclass) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  swapped record;
  reg record;
BEGIN
  SELECT u.col, u.was, u.now, a.attname INTO swapped
    FROM fencekit.protected p,
         ROWS FROM (pg_catalog.unnest(fencekit.bound_attnums(rel, p.spec)),
                    pg_catalog.unnest(p.attnums),
                    pg_catalog.jsonb_array_elements_text(
                      CASE p.spec ->> 'scope' WHEN 'row'
                        THEN pg_catalog.jsonb_build_array(p.spec -> 'column')
                        ELSE p.spec -> 'key' END)) AS u(now, was, col)
         LEFT JOIN pg_catalog.pg_attribute a
           ON a.attrelid = rel AND a.attnum = u.was AND NOT a.attisdropped
   WHERE p.table_oid = rel::oid AND fencekit.recorded_oids_hold(p.tag)
     AND p.attnums IS NOT NULL
     AND u.now IS DISTINCT FROM u.was AND (u.now IS NOT NULL OR a.attname IS NOT NULL)
   LIMIT 1;
  IF FOUND AND swapped.now IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: column %I of %s was renamed to %I, the column it '
                                  'was protected with', swapped.col, rel, swapped.attname),
      DETAIL = 'Protecting it again would add a new, empty column under the old name and take '
               'it for the protected one: the fences kept in the renamed one would be lost.',
      HINT = pg_catalog.format('Rename it back: ALTER TABLE %s RENAME COLUMN %I TO %I; or '
                               'unprotect and protect again (the fences restart).', rel,
                               swapped.attname, swapped.col),
      COLUMN = swapped.col;
  ELSIF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: column %I of %s is not the column it was protected '
                                  'with: that one %s', swapped.col, rel,
                                  COALESCE('is now named ' || pg_catalog.quote_ident(
                                             swapped.attname),
                                           'was dropped')),
      DETAIL = 'Protecting it again, or moving it, would take the new column for the protected '
               'one: the fences kept with the old one would be lost.',
      HINT = 'Rename the columns back, or unprotect and protect again (the fences restart).',
      COLUMN = swapped.col;
  END IF;
  FOR reg IN SELECT p.spec, p.spec ->> 'column' AS col, p.tag FROM fencekit.protected p
              WHERE rel IN (fencekit.protected_table(p.tag),
                            pg_catalog.to_regclass(pg_catalog.format('%I.%I', p.schema_name,
                                                                     p.table_name))) LOOP
    IF reg.spec ->> 'scope' = 'row' THEN
      PERFORM fencekit.check_descendant_columns(rel, reg.col, 'fencekit_' || reg.tag || '_ins');
    END IF;
    -- While the recorded oids hold, the attnums above say it (the _keys trigger may merely
    -- have been replaced, which status reports and protect mends).
    SELECT * INTO swapped FROM fencekit.swapped_key_columns(rel, reg.spec, reg.tag)
     WHERE NOT fencekit.recorded_oids_hold(reg.tag) LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I of %s is not the column it was '
                                    'protected with: that one %s', swapped.col, rel,
                                    COALESCE('is now named ' || pg_catalog.quote_ident(
                                               swapped.was), 'was dropped')),
        DETAIL = 'Protecting it again, or moving it, would take the new column for the '
                 'protected one: the fences stay named by the old one''s values.',
        HINT = 'Rename the columns back, or unprotect and protect again (the fences restart).',
        COLUMN = swapped.col;
    END IF;
  END LOOP;
END
$fn$;

-- The generation expressions of a key fence's generated key columns on `rel` and on each of
-- its partitions and inheritance children (PostgreSQL 17+ changes one with ALTER COLUMN ... SET
-- EXPRESSION, on any of them alone, and rewrites its rows' keys without any trigger), as
-- {relation oid: fingerprint}: the md5 of each relation's stored trees (pg_attrdef.adbin read
-- as text, without the parse locations, which only say where the text stood), after the
-- server's major version (another major writes trees otherwise: pg_upgrade). Never
-- pg_get_expr: printing a tree runs the output functions of its constants' types, which may be
-- the owner's. NULL for other scopes and for a tree with no generated key column.
CREATE OR REPLACE FUNCTION fencekit.key_expressions(rel regclass, spec jsonb) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.jsonb_object_agg(t.relid::text, t.print)
    FROM (SELECT r.relid,
                 (pg_catalog.current_setting('server_version_num')::int / 10000)::text || ':'
                 || pg_catalog.md5(pg_catalog.string_agg(
                      u.col || '=' || pg_catalog.regexp_replace(d.adbin::text,
                                                                ' :location -?[0-9]+', '', 'g'),
                      ';' ORDER BY u.o)) AS print
            FROM (SELECT rel::oid UNION ALL SELECT s.child::oid
                    FROM fencekit.descendants(rel) s) AS r(relid)
           CROSS JOIN pg_catalog.jsonb_array_elements_text(
                        CASE WHEN spec ->> 'scope' = 'key' THEN spec -> 'key' END)
                        WITH ORDINALITY AS u(col, o)
           JOIN pg_catalog.pg_attribute a
             ON a.attrelid = r.relid AND a.attname = u.col AND a.attnum > 0
                AND NOT a.attisdropped AND a.attgenerated <> ''
           JOIN pg_catalog.pg_attrdef d ON d.adrelid = r.relid AND d.adnum = a.attnum
           GROUP BY r.relid) AS t
$fn$;

-- The relations of `rel`'s tree whose generated key columns' expressions changed since protect
-- recorded them (fencekit.protected.key_expressions), in oid order: compared while the table
-- has the oid protect recorded, under the major version that recorded them, on the relations
-- still in the tree and still generating their key. (A column whose expression was dropped
-- keeps its values and is then written through the key triggers.) Reads the catalogs and
-- fencekit.protected only.
CREATE OR REPLACE FUNCTION fencekit.key_expressions_changed(rel regclass) RETURNS regclass[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  WITH p AS (SELECT p.key_expressions AS was, fencekit.key_expressions(rel, p.spec) AS now
               FROM fencekit.protected p
              WHERE p.table_oid = rel::oid AND p.key_expressions IS NOT NULL
                AND fencekit.recorded_oids_hold(p.tag))
  SELECT ARRAY(
    SELECT w.key::oid::regclass
      FROM p CROSS JOIN pg_catalog.jsonb_each_text(p.was) AS w(key, value)
     WHERE p.now ? w.key
       AND p.now ->> w.key IS DISTINCT FROM w.value
       AND pg_catalog.split_part(w.value, ':', 1)
           = (pg_catalog.current_setting('server_version_num')::int / 10000)::text
     ORDER BY w.key::oid)
$fn$;

-- Refuses (YF000) a key-fenced table whose generated key column's expression changed since
-- protect recorded it (fencekit.key_expressions_changed): the rows moved onto other keys, whose
-- fences do not hold what the old keys' did; protecting it again would take that for current.
CREATE OR REPLACE FUNCTION fencekit.check_key_expressions(rel regclass) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  changed regclass[] := fencekit.key_expressions_changed(rel);
BEGIN
  IF pg_catalog.cardinality(changed) > 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: the generation expression of a key column of %s '
                                  'changed since it was protected (on %s)', rel,
                                  pg_catalog.array_to_string(changed, ', ')),
      DETAIL = 'Changing it rewrote the rows'' keys without any trigger: the fences of the old '
               'keys no longer guard the rows.',
      HINT = 'Set the expression back as it was, or unprotect and protect again (the fences '
             'restart).';
  END IF;
END
$fn$;

-- Refuse to protect fencekit's own tables, DDL that would run the owner's code in this session
-- (check_ddl_runs_no_owner_code), a tree holding a foreign table, a table already protected
-- with another scope, key, resource or fence column (`structure`: those four of the spec; that
-- is a move, which carries the fences; policies alone change by re-running protect), or one
-- whose fence or key column was swapped since protect recorded it (check_bound_columns), and a
-- table or key fence on a table that inherits from another: such a fence's checks are all
-- statement-level, and PostgreSQL fires a table's statement triggers only for statements that
-- name it, so `UPDATE parent ...` would write the child's rows judged by nothing of its own
-- (by the parent's fence at most, when the parent is protected).
CREATE OR REPLACE FUNCTION fencekit.protect_guard(rel regclass, structure jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  sch name;
  tbl name;
  have jsonb;
  parent regclass;
  protected regclass;
  holds boolean;
  restored boolean;
BEGIN
  SELECT n.nspname, c.relname INTO sch, tbl
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
   WHERE c.oid = rel;
  IF sch = 'fencekit' THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = 'fencekit: fencekit''s own tables cannot be protected',
      HINT = 'Only the DBA and fencekit_admin write them; protect your own tables.';
  END IF;
  SELECT i.inhparent::regclass INTO parent FROM pg_catalog.pg_inherits i
   WHERE i.inhrelid = rel ORDER BY i.inhseqno LIMIT 1;
  IF parent IS NOT NULL AND structure ->> 'scope' IN ('table', 'key') THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s cannot have a %s fence: it inherits from %s, '
                                  'and statements that name %s write its rows without its '
                                  'checks; nothing was changed', rel, structure ->> 'scope',
                                  parent, parent),
      DETAIL = 'A table or key fence''s checks are statement triggers, which PostgreSQL fires '
               'only for statements naming the table; a protected parent judges such a '
               'statement by its own fence.',
      HINT = pg_catalog.format('Protect the parent (its children are covered by its fence), '
                               'detach this table (ALTER TABLE %s NO INHERIT %s), or give it a '
                               'row fence, whose checks fire on its rows whatever the statement '
                               'names.', rel, parent);
  END IF;
  -- Protect creates the table's functions and counters in schema fencekit, where only the
  -- installer and superusers create (00_schema.sql): say so before anything is changed.
  IF NOT pg_catalog.has_schema_privilege('fencekit', 'CREATE') THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = pg_catalog.format(
        'fencekit: %I cannot protect %s: protect creates the table''s functions in schema '
        'fencekit, where only the role that installed fencekit and superusers create; '
        'nothing was changed', current_user, rel),
      HINT = 'Protect it as the role that installed fencekit or as a superuser. Membership of '
             'fencekit_admin is not enough, by design: anyone who can create in schema fencekit '
             'could put code where fencekit''s own functions would run it.';
  END IF;
  -- The tree is locked before it is judged: a partition being attached, created or detached
  -- holds a lock this waits for, so the checks below read the tree CREATE TRIGGER will load
  -- (a partition key's code among it). At READ COMMITTED each of them reads the catalogs
  -- anew, after the lock; a REPEATABLE READ snapshot could predate what the lock waited for.
  IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: protect of %s runs at READ COMMITTED, not %s: '
                                  'its checks must read the table as it is once locked; '
                                  'nothing was changed', rel,
                                  pg_catalog.current_setting('transaction_isolation')),
      HINT = 'Run it in a transaction started with BEGIN ISOLATION LEVEL READ COMMITTED.';
  END IF;
  -- dynamic SQL: LOCK TABLE takes no parameter; the table is a regclass known at run time
  EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', rel);
  PERFORM fencekit.check_ddl_runs_no_owner_code(rel);
  PERFORM fencekit.refuse_foreign_descendant(rel);
  SELECT pg_catalog.jsonb_build_object('scope', p.spec -> 'scope', 'key', p.spec -> 'key',
                                       'resource', p.spec -> 'resource',
                                       'column', p.spec -> 'column')
    INTO have
    FROM fencekit.protected p WHERE p.schema_name = sch AND p.table_name = tbl;
  IF have IS DISTINCT FROM structure AND have IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s is already protected with another scope, key, '
                                  'resource or fence column', rel),
      HINT = 'Move it in one transaction, fences carried: fencekit move TABLE <new options> '
             '--dsn DSN, fencekit sql move, or alembic op.move_fence; policies alone change by '
             're-running protect.';
  END IF;
  -- The table under the registered name must be the protected table (fencekit.protected_table):
  -- its owner may rename the protected one away, drop its triggers and put another table under
  -- the name; protecting that one would move the registry row onto it. After a restore
  -- (the table's fencekit.<tag>_stmt exists under another oid than the one recorded) only a
  -- trigger only an admin can attach says which table it is: a table under the name without
  -- one may be such another table, and is refused as well.
  SELECT fencekit.protected_table(p.tag), fencekit.recorded_oids_hold(p.tag),
         NOT fencekit.recorded_oids_hold(p.tag)
         AND pg_catalog.to_regprocedure(pg_catalog.format('fencekit.%I()', p.tag || '_stmt'))
             IS NOT NULL
    INTO protected, holds, restored
    FROM fencekit.protected p WHERE p.schema_name = sch AND p.table_name = tbl;
  IF protected IS DISTINCT FROM rel AND protected IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s is not the table protected under that name: '
                                  'that one is now %s (%s); nothing was changed', rel,
                                  protected,
                                  CASE WHEN holds THEN 'the oid protect recorded'
                                       ELSE 'it carries the protected table''s triggers' END),
      HINT = pg_catalog.format('Rename the tables back, or move the protection to the new '
                               'name: fencekit rename %s %s; fencekit status reports both.',
                               rel, protected);
  ELSIF protected IS NULL AND restored THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s carries none of the triggers of the table '
                                  'protected under that name, whose record is from before a '
                                  'restore: nothing tells that it is that table; nothing was '
                                  'changed', rel),
      DETAIL = 'Its owner may have dropped the protected table''s triggers, renamed it away and '
               'put another table under its name: protecting this one would move the '
               'protection onto it.',
      HINT = pg_catalog.format('If %s is the protected table (its triggers were dropped, or it '
                               'was dropped and created again), unprotect it and protect it '
                               'again (the fences restart); fencekit status reports what it '
                               'sees.', rel);
  END IF;
  PERFORM fencekit.check_bound_columns(rel);
  PERFORM fencekit.check_key_expressions(rel);
END
$fn$;

-- Add a row fence's column unless it exists: nullable, no default yet, so a catalog-only change
-- (no table rewrite). ADD COLUMN IF NOT EXISTS would print a NOTICE on every re-run.
CREATE OR REPLACE FUNCTION fencekit.add_fence_column(rel regclass, col name)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0
                    AND NOT a.attisdropped) THEN
    -- dynamic SQL: the table and column are known only at run time (quoted by format)
    EXECUTE pg_catalog.format('ALTER TABLE %s ADD COLUMN %I bigint', rel, col);
  END IF;
END
$fn$;

-- A table's counters (fencekit.create_counters), created only while one is missing: that
-- function uses CREATE SEQUENCE IF NOT EXISTS, which prints a NOTICE per existing sequence.
CREATE OR REPLACE FUNCTION fencekit.ensure_counters(tag text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF EXISTS (SELECT FROM pg_catalog.unnest(fencekit.counter_names()) r
              WHERE pg_catalog.to_regclass(pg_catalog.format('fencekit.%I', tag || ':' || r))
                    IS NULL) THEN
    PERFORM fencekit.create_counters(tag);
  END IF;
END
$fn$;

-- Record (or update) a protected table in the registry, with the attnums of the columns its
-- objects read by name (fencekit.bound_attnums); a re-run with the same spec, template, key
-- families and columns changes nothing. A resource is shared by key fences or by table fences,
-- never both: a table fence is its resource's key '', which a key fence's keys share, so a
-- writer of one table would advance the other's fence and lock its holder out.
CREATE OR REPLACE FUNCTION fencekit.register_table(schema_name text, table_name text, tag text,
                                                   resource text, spec jsonb,
                                                   template_version integer,
                                                   key_families text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
DECLARE
  other record;
  rel regclass;
BEGIN
  SELECT p.schema_name, p.table_name, p.scope INTO other
    FROM fencekit.protected p
   WHERE p.resource = register_table.resource AND p.scope IN ('key', 'table')
     AND p.scope <> (spec ->> 'scope')
     AND (p.schema_name, p.table_name) <> (register_table.schema_name, register_table.table_name)
   ORDER BY p.schema_name, p.table_name LIMIT 1;
  IF FOUND AND spec ->> 'scope' IN ('key', 'table') THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: resource %L cannot be shared by a key fence and a '
                                  'table fence: %I.%I has a %s fence on it', resource,
                                  other.schema_name, other.table_name, other.scope),
      DETAIL = 'A table fence is its resource''s key '''', which a key fence''s keys share: '
               'writers of one table would advance the other''s fence.',
      HINT = 'Give one of them another resource name.';
  END IF;
  rel := pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name, table_name));
  -- Last in protect, after the cover: a child whose swapped fence column no witness named
  -- before (its INSERT trigger and every fence DEFAULT dropped) is named now that the protect
  -- set the DEFAULT again, and refused before it is recorded as bound. Only on a table already
  -- protected: protected afresh (after unprotect), a column the last protection bound keeps no
  -- fence anything still reads, and the fences restart.
  IF spec ->> 'scope' = 'row'
     AND EXISTS (SELECT FROM fencekit.protected p
                  WHERE (p.schema_name, p.table_name)
                        = (register_table.schema_name, register_table.table_name)) THEN
    PERFORM fencekit.check_descendant_columns(rel, spec ->> 'column',
                                              'fencekit_' || tag || '_ins');
  END IF;
  INSERT INTO fencekit.protected AS p
         (schema_name, table_name, tag, scope, resource, spec, template_version, key_families,
          table_oid, attnums, child_attnums, function_oid, cluster_id, key_expressions)
  VALUES (schema_name, table_name, tag, spec ->> 'scope', resource, spec, template_version,
          key_families, rel, fencekit.bound_attnums(rel, spec),
          fencekit.child_attnums(rel, spec),
          pg_catalog.to_regprocedure(pg_catalog.format('fencekit.%I()', tag || '_stmt')),
          fencekit.cluster_id(), fencekit.key_expressions(rel, spec))
  ON CONFLICT ON CONSTRAINT protected_pkey DO UPDATE
    SET tag = excluded.tag, scope = excluded.scope, resource = excluded.resource,
        spec = excluded.spec, template_version = excluded.template_version,
        key_families = excluded.key_families, table_oid = excluded.table_oid,
        attnums = excluded.attnums, child_attnums = excluded.child_attnums,
        function_oid = excluded.function_oid, cluster_id = excluded.cluster_id,
        key_expressions = excluded.key_expressions,
        -- A partition added since (its expressions recorded now) is no new protection.
        protected_at = CASE WHEN (p.spec, p.template_version, p.key_families, p.table_oid,
                                  p.attnums)
                                 IS DISTINCT FROM (excluded.spec, excluded.template_version,
                                                   excluded.key_families, excluded.table_oid,
                                                   excluded.attnums)
                            THEN pg_catalog.now() ELSE p.protected_at END
    WHERE (p.spec, p.template_version, p.key_families, p.table_oid, p.attnums)
          IS DISTINCT FROM (excluded.spec, excluded.template_version, excluded.key_families,
                            excluded.table_oid, excluded.attnums)
       OR (p.key_expressions, p.child_attnums, p.function_oid, p.cluster_id)
          IS DISTINCT FROM (excluded.key_expressions, excluded.child_attnums,
                            excluded.function_oid, excluded.cluster_id);
END
$fn$;
