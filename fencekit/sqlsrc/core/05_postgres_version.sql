-- The PostgreSQL majors this fencekit is tested on: each runs the fence contract in fencekit's
-- test matrix (docs/testing.md). Install refuses any other major, whose MERGE, transition
-- tables, generated columns or privileges may behave differently, unless the session asks for
-- it: SET fencekit.allow_untested_postgres = on (`fencekit install --allow-untested-postgres`).
-- The install script runs in one transaction, so a refusal leaves nothing behind.
CREATE OR REPLACE FUNCTION fencekit.tested_postgres() RETURNS int4range
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.int4range(14, 18, '[]')
$fn$;

CREATE OR REPLACE FUNCTION fencekit.check_postgres_version(tested int4range) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  major integer := pg_catalog.current_setting('server_version_num')::integer / 10000;
  shown text := pg_catalog.format('%s to %s', pg_catalog.lower(tested),
                                  pg_catalog.upper(tested) - 1);
  override text := pg_catalog.lower(coalesce(
    pg_catalog.current_setting('fencekit.allow_untested_postgres', true), ''));
BEGIN
  IF major <@ tested THEN
    RETURN;
  END IF;
  IF override IN ('on', 'true', 'yes', '1') THEN
    RAISE WARNING USING MESSAGE = pg_catalog.format(
      'fencekit: installing on PostgreSQL %s, which this fencekit is not tested on (tested: '
      'PostgreSQL %s), because fencekit.allow_untested_postgres is on',
      pg_catalog.current_setting('server_version'), shown);
    RETURN;
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'YF000',
    MESSAGE = pg_catalog.format('fencekit: PostgreSQL %s is not tested with this fencekit '
                                '(tested: PostgreSQL %s)',
                                pg_catalog.current_setting('server_version'), shown),
    DETAIL = 'fencekit''s triggers lean on behaviour that changes between major versions '
             '(MERGE, transition tables, generated columns, privileges on settings).',
    HINT = 'To install anyway: fencekit install --allow-untested-postgres, or run '
           '"SET fencekit.allow_untested_postgres = on" before the install script in psql.';
END
$fn$;

SELECT fencekit.check_postgres_version(fencekit.tested_postgres());
