-- The guards of the unprotect, move and rename scripts: each refuses (YF000), changing nothing,
-- unless fencekit.protected holds exactly the spec the script was generated for (a script for
-- other options would strand fences or drop the wrong column), and its hint names the command
-- that generates the right script for what the registry holds. SECURITY INVOKER: they read
-- fencekit.protected (readable by everyone) and built-in types only.

-- A word quoted for a POSIX shell, as Python's shlex.quote quotes it; NULL stays NULL.
CREATE OR REPLACE FUNCTION fencekit.shell_quote(word text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT CASE WHEN word ~ '^[A-Za-z0-9_@%+=:,./-]+$' THEN word
              ELSE '''' || replace(word, '''', '''"''"''') || '''' END
$fn$;

-- The command-line arguments that reproduce spec for the table tbl (as SQL writes its name),
-- shell-quoted: what FenceSpec.cli_args prints for the same spec (a test compares them).
CREATE OR REPLACE FUNCTION fencekit.spec_args(tbl text, spec jsonb) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT concat_ws(' ', fencekit.shell_quote(tbl),
    CASE WHEN spec ->> 'scope' = 'table' THEN '--scope table' END,
    (SELECT string_agg('--key ' || fencekit.shell_quote(k), ' ' ORDER BY o)
       FROM jsonb_array_elements_text(spec -> 'key') WITH ORDINALITY AS e(k, o)),
    '--resource ' || fencekit.shell_quote(spec ->> 'resource'),
    CASE WHEN spec ->> 'on_missing' <> 'reject' THEN '--on-missing ' || (spec ->> 'on_missing') END,
    CASE WHEN spec ->> 'on_equal' <> 'accept' THEN '--on-equal ' || (spec ->> 'on_equal') END,
    CASE WHEN spec ->> 'scope' = 'row' AND spec ->> 'column' <> 'fencekit_fence'
         THEN '--column ' || fencekit.shell_quote(spec ->> 'column') END,
    '--issuer ' || fencekit.shell_quote(spec ->> 'issuer'))
$fn$;

-- What the registry holds for the table named in a spec ('table': schema and name); NULL when
-- the table is not protected.
CREATE OR REPLACE FUNCTION fencekit.registered_spec(wanted jsonb) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT p.spec FROM fencekit.protected p
   WHERE p.schema_name = wanted -> 'table' ->> 'schema'
     AND p.table_name = wanted -> 'table' ->> 'name'
$fn$;

-- The unprotect script's guard. A table the registry does not know gets a NOTICE: the script
-- then only removes leftover objects. DROP COLUMN on a partitioned table loads its partition
-- key: not in an admin's session when that key runs the owner's code (47_protect.sql).
CREATE OR REPLACE FUNCTION fencekit.unprotect_guard(tbl text, spec jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  have jsonb := fencekit.registered_spec(spec);
BEGIN
  IF to_regclass(tbl) IS NOT NULL THEN
    PERFORM fencekit.check_ddl_runs_no_owner_code(to_regclass(tbl));
  END IF;
  IF have IS NULL THEN
    RAISE NOTICE 'fencekit: % is not in fencekit.protected; removing leftover fencekit objects only',
      tbl;
  ELSIF have IS DISTINCT FROM spec THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = format('fencekit: this script unprotects %s with spec %s, but fencekit.protected '
                       'holds %s; nothing was changed', tbl, spec, have),
      HINT = format('Generate the script for what is there: fencekit sql unprotect %s (or run '
                    'fencekit unprotect TABLE --dsn DSN, which reads the spec from the registry)',
                    fencekit.spec_args(tbl, have));
  END IF;
END
$fn$;

-- The move script's guard: old must be what the registry holds; the hints name the new spec.
CREATE OR REPLACE FUNCTION fencekit.move_guard(tbl text, old jsonb, new jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  have jsonb := fencekit.registered_spec(old);
BEGIN
  IF have IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = format('fencekit: %s is not protected; nothing was moved', tbl),
      HINT = 'Protect it: fencekit protect ' || fencekit.spec_args(tbl, new);
  ELSIF have IS DISTINCT FROM old THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = format('fencekit: this script moves %s from spec %s, but fencekit.protected '
                       'holds %s; nothing was changed', tbl, old, have),
      HINT = format('Generate the script from what is there: fencekit sql move %s --dsn DSN (it '
                    'reads the current spec from the registry)', fencekit.spec_args(tbl, new));
  END IF;
END
$fn$;

-- The rename script's guard, for the spec under the old name (tbl); new_tbl is the new name.
-- The table under the new name must be the protected table (fencekit.protected_table: the oid
-- protect recorded, or after a restore the triggers only an admin can attach), never a table
-- that merely carries a trigger named like fencekit's: its owner may drop the protected
-- table's triggers and give their names to another table's. Before anything changes, the
-- renamed table's fence or key columns are checked against what protect recorded for it
-- (fencekit.check_bound_columns): the script then deletes that registry row and protects the
-- table again under the new name, which would bind the protection to a column the owner
-- swapped in, with nothing left to compare it to.
CREATE OR REPLACE FUNCTION fencekit.rename_guard(tbl text, spec jsonb, new_tbl text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  have jsonb := fencekit.registered_spec(spec);
  protected regclass;
  holds boolean;
BEGIN
  IF have IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = format('fencekit: %s is not in fencekit.protected; nothing to rename', tbl),
      HINT = 'fencekit status lists the protected tables.';
  ELSIF have IS DISTINCT FROM spec THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = format('fencekit: this script renames %s with spec %s, but fencekit.protected '
                       'holds %s; nothing was changed', tbl, spec, have),
      HINT = format('Generate the script for what is there: fencekit sql rename %s %s (or run '
                    'fencekit rename OLD NEW --dsn DSN)', fencekit.spec_args(tbl, have), new_tbl);
  END IF;
  IF to_regclass(new_tbl) IS NOT NULL THEN
    SELECT fencekit.protected_table(p.tag), fencekit.recorded_oids_hold(p.tag)
      INTO protected, holds
      FROM fencekit.protected p
     WHERE p.schema_name = rename_guard.spec -> 'table' ->> 'schema'
       AND p.table_name = rename_guard.spec -> 'table' ->> 'name';
    IF protected IS DISTINCT FROM to_regclass(new_tbl) THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = format('fencekit: %s is not %s renamed (%s); nothing was changed', new_tbl,
                         tbl, CASE WHEN protected IS NULL
                                 THEN 'no table has the oid protect recorded, nor carries its '
                                      'triggers'
                               WHEN holds
                                 THEN format('that one is %s, the oid protect recorded',
                                             protected)
                               ELSE format('that one is %s, which carries its triggers',
                                           protected) END),
        HINT = 'fencekit status shows where the protected table is; a trigger''s name alone '
               'does not make a table the protected one.';
    END IF;
    PERFORM fencekit.check_bound_columns(to_regclass(new_tbl));
  END IF;
END
$fn$;
