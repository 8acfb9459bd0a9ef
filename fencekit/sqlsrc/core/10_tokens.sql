-- Validating the token and judging the bypass switch. Generated triggers test the common case
-- inline (one regular expression); these run on the slow paths only.

CREATE OR REPLACE FUNCTION fencekit.is_valid_token(raw text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  -- Canonical positive decimal within bigint: no sign, spaces, leading zeros or exponent.
  SELECT raw ~ '^[1-9][0-9]{0,18}$'
     AND (pg_catalog.length(raw) < 19 OR raw COLLATE "C" <= '9223372036854775807')
$fn$;

-- The role a session acts as: the one it SET ROLE to, else the one it logged in as. It is what
-- the bypass is judged by, never current_user: inside a referential action PostgreSQL runs as
-- the table owner, inside a SECURITY DEFINER function as its owner, and neither may lend its
-- rights. SET ROLE itself only reaches roles the login role is a member of.
CREATE OR REPLACE FUNCTION fencekit.session_role() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user
              ELSE pg_catalog.current_setting('role')::name END
$fn$;

-- True when fencekit.bypass is on and the session's role may bypass; false when it is off.
-- Raises YF005 when it is on for a session whose role is not a member of fencekit_admin.
CREATE OR REPLACE FUNCTION fencekit.bypass_allowed(tag text, relid oid, trigger_name text)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  raw text := pg_catalog.lower(pg_catalog.current_setting('fencekit.bypass', true));
  who name;
BEGIN
  IF raw IS NULL OR raw IN ('', 'off', 'false', '0', 'no') THEN
    RETURN false;
  END IF;
  IF raw NOT IN ('on', 'true', '1', 'yes') THEN
    PERFORM fencekit.reject('usage', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL,
      pg_catalog.format('fencekit.bypass must be on or off, not %L', raw));
  END IF;
  who := fencekit.session_role();
  IF pg_catalog.pg_has_role(who, 'fencekit_admin', 'MEMBER') THEN
    RETURN true;
  END IF;
  PERFORM fencekit.reject('bypass_refused', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL,
                          who::text);
  RETURN false;
END
$fn$;
