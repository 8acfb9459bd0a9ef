-- Install into (and, from fencekit's commands, read) only a schema fencekit that fencekit's
-- side owns. A table owner with CREATE on the database can make schema fencekit before the
-- first install or after an uninstall. Whoever owns schema fencekit, or a table, view,
-- sequence, type or function in it, or put a trigger, rule or policy on its tables, could run
-- their own code as the installer (a superuser, often) while this script writes fencekit.meta
-- (or a command reads it), or replace a helper the core's definer functions call. So every
-- such object must belong to the installing role, a superuser or a member of fencekit_admin
-- (protect leaves a table's generated functions and counters to the role that ran it); the one
-- exception is a row fence's TRUNCATE check, which protect gives to its table's owner on
-- purpose (docs/security.md). Handing such objects over (ALTER ... OWNER TO) keeps their code
-- attached, so nothing attached to fencekit's tables, views and types (a default, a CHECK, an
-- index or statistics expression, a view's query, a domain's CHECK) may call a function,
-- operator or type outside pg_catalog and schema fencekit either, and no table outside it may
-- inherit from one of its tables (planning a read folds the child's CHECK). Reads catalogs
-- only; runs before anything else of the install (fencekit_admin may not exist yet).
-- fencekit's commands run it before they read schema fencekit, with fencekit.guard_reading
-- on: then objects merely owned by another role are left to status (owner_changed, which a
-- pg_restore by an application role leaves), and only code attached to them is refused.
DO $do$
DECLARE
  me oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
  admin oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) 'fencekit_admin');
  reading boolean := COALESCE(pg_catalog.current_setting('fencekit.guard_reading', true), '')
                     OPERATOR(pg_catalog.=) 'on';
  found text;
BEGIN
  WITH trusted(oid) AS (
    SELECT me UNION SELECT r.oid FROM pg_catalog.pg_roles r
     WHERE r.rolsuper OR (admin IS NOT NULL AND pg_catalog.pg_has_role(r.oid, admin, 'MEMBER'))
  ), ns AS (
    SELECT n.oid, n.nspowner FROM pg_catalog.pg_namespace n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'fencekit'
  ), own(classid, objid) AS (
    -- fencekit's relations and types
    SELECT 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid, c.oid
      FROM pg_catalog.pg_class c JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
    UNION
    SELECT 'pg_catalog.pg_type'::pg_catalog.regclass::pg_catalog.oid, t.oid
      FROM pg_catalog.pg_type t JOIN ns ON t.typnamespace OPERATOR(pg_catalog.=) ns.oid
  ), attached(classid, objid) AS (
    -- and what is part of them (defaults, constraints, indexes, statistics, triggers, rules,
    -- policies, a view's query), not what another schema built on them
    SELECT classid, objid FROM own
    UNION
    SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
      JOIN own o ON d.refclassid OPERATOR(pg_catalog.=) o.classid
                AND d.refobjid OPERATOR(pg_catalog.=) o.objid
     WHERE d.deptype IN ('a', 'i')
  )
  SELECT pg_catalog.string_agg(what, '; ' ORDER BY what) INTO found FROM (
    SELECT pg_catalog.format('schema fencekit (owner %s)', ns.nspowner::pg_catalog.regrole) AS what
      FROM ns WHERE ns.nspowner NOT IN (SELECT oid FROM trusted) AND NOT reading
    UNION ALL
    SELECT pg_catalog.format('%s (owner %s)', c.oid::pg_catalog.regclass, c.relowner::pg_catalog.regrole)
      FROM pg_catalog.pg_class c JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE c.relowner NOT IN (SELECT oid FROM trusted) AND NOT reading
    UNION ALL
    SELECT pg_catalog.format('type %s (owner %s)', t.oid::pg_catalog.regtype, t.typowner::pg_catalog.regrole)
      FROM pg_catalog.pg_type t JOIN ns ON t.typnamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE t.typowner NOT IN (SELECT oid FROM trusted) AND NOT reading
    UNION ALL
    SELECT pg_catalog.format('function %s (owner %s)', p.oid::pg_catalog.regprocedure,
                             p.proowner::pg_catalog.regrole)
      FROM pg_catalog.pg_proc p JOIN ns ON p.pronamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE p.proowner NOT IN (SELECT oid FROM trusted) AND NOT reading
       AND NOT (p.proname::pg_catalog.text OPERATOR(pg_catalog.~) '_trunc$'
                AND EXISTS (SELECT FROM pg_catalog.pg_trigger g
                              JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) g.tgrelid
                             WHERE g.tgfoid OPERATOR(pg_catalog.=) p.oid
                               AND c.relowner OPERATOR(pg_catalog.=) p.proowner))
    UNION ALL
    SELECT pg_catalog.format('trigger %I on %s', g.tgname, c.oid::pg_catalog.regclass)
      FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) g.tgrelid
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid WHERE NOT g.tgisinternal
       -- but fencekit's own: the attribution tables' commit-time triggers (22_attribution.sql),
       -- each calling fencekit's function of its name, owned by a trusted role (reading: by
       -- anyone, as for fencekit's other functions, whose owner status reports)
       AND NOT (pg_catalog.concat(c.relname, ' ', g.tgname) OPERATOR(pg_catalog.=) ANY (ARRAY[
                  'unfenced_writers unfenced_writer_at_commit',
                  'unfenced_overflow unfenced_overflow_at_commit',
                  'unfenced_log unfenced_log_commit_marker'])
                AND EXISTS (SELECT FROM pg_catalog.pg_proc p
                             WHERE p.oid OPERATOR(pg_catalog.=) g.tgfoid
                               AND p.pronamespace OPERATOR(pg_catalog.=) ns.oid
                               AND p.proname OPERATOR(pg_catalog.=) g.tgname
                               AND (reading OR p.proowner IN (SELECT oid FROM trusted))))
    UNION ALL
    SELECT pg_catalog.format('rule %I on %s', w.rulename, c.oid::pg_catalog.regclass)
      FROM pg_catalog.pg_rewrite w JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) w.ev_class
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
     WHERE w.rulename OPERATOR(pg_catalog.<>) '_RETURN'
    UNION ALL
    SELECT pg_catalog.format('policy %I on %s', y.polname, c.oid::pg_catalog.regclass)
      FROM pg_catalog.pg_policy y JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) y.polrelid
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
    UNION ALL
    SELECT pg_catalog.format('%s inherits from %s', i.inhrelid::pg_catalog.regclass,
                             i.inhparent::pg_catalog.regclass)
      FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhparent
      JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
    UNION ALL
    SELECT pg_catalog.format('%s calls %s',
             pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid),
             pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0))
      FROM pg_catalog.pg_depend d
      JOIN attached a ON a.classid OPERATOR(pg_catalog.=) d.classid
                     AND a.objid OPERATOR(pg_catalog.=) d.objid
     WHERE d.deptype OPERATOR(pg_catalog.=) 'n'
       AND CASE
             WHEN d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid THEN
               (SELECT p.pronamespace FROM pg_catalog.pg_proc p
                 WHERE p.oid OPERATOR(pg_catalog.=) d.refobjid)
             WHEN d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_operator'::pg_catalog.regclass::pg_catalog.oid THEN
               (SELECT o.oprnamespace FROM pg_catalog.pg_operator o
                 WHERE o.oid OPERATOR(pg_catalog.=) d.refobjid)
             WHEN d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass::pg_catalog.oid THEN
               (SELECT t.typnamespace FROM pg_catalog.pg_type t
                 WHERE t.oid OPERATOR(pg_catalog.=) d.refobjid)
           END NOT IN (SELECT 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid
                       UNION ALL SELECT ns.oid FROM ns)
  ) x;
  IF found IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format(
        'fencekit: refusing to install into, or read, schema fencekit as %s: %s. Their owners '
        'could run their code with your rights while the install or the command runs, or '
        'replace what fencekit''s functions call; nothing was changed', current_user, found),
      HINT = 'Schema fencekit and everything in it must belong to the installing role, a '
        'superuser or a member of fencekit_admin, with no trigger, rule or policy fencekit did '
        'not make, and nothing on its tables that calls code outside pg_catalog and fencekit. '
        'Drop what another role made (a schema made by someone else: DROP SCHEMA fencekit '
        'CASCADE, after saving any fences you need), or install as the role that owns it.';
  END IF;
END
$do$;
