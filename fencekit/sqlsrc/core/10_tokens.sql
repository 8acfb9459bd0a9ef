-- Reading the token and the bypass switch. Called once per statement by the generated
-- statement triggers; row triggers only take the slow path through here.

CREATE OR REPLACE FUNCTION fencekit.token_text() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  -- After a transaction that set it ends, the same session reads '', not NULL.
  SELECT CASE WHEN pg_catalog.current_setting('fencekit.token', true) = '' THEN NULL
              ELSE pg_catalog.current_setting('fencekit.token', true) END
$fn$;

CREATE OR REPLACE FUNCTION fencekit.is_valid_token(raw text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
  -- Canonical positive decimal within bigint: no sign, spaces, leading zeros or exponent.
  SELECT raw ~ '^[1-9][0-9]{0,18}$'
     AND (pg_catalog.length(raw) < 19 OR raw COLLATE "C" <= '9223372036854775807')
$fn$;

-- The presented token of the current statement, or NULL when none is set.
-- Raises YF004 for a malformed token.
CREATE OR REPLACE FUNCTION fencekit.statement_token(tag text, relid oid, trigger_name text)
RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  raw text := fencekit.token_text();
BEGIN
  IF raw IS NULL THEN
    RETURN NULL;
  END IF;
  IF NOT fencekit.is_valid_token(raw) THEN
    PERFORM fencekit.reject('malformed', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL, raw);
  END IF;
  RETURN raw::bigint;
END
$fn$;

-- True when fencekit.bypass is on and the current role may bypass; false when it is off.
-- Raises YF005 when it is on for a role that is not a member of fencekit_admin.
CREATE OR REPLACE FUNCTION fencekit.bypass_allowed(tag text, relid oid, trigger_name text)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  raw text := pg_catalog.lower(pg_catalog.current_setting('fencekit.bypass', true));
BEGIN
  IF raw IS NULL OR raw IN ('', 'off', 'false', '0', 'no') THEN
    RETURN false;
  END IF;
  IF raw NOT IN ('on', 'true', '1', 'yes') THEN
    PERFORM fencekit.reject('usage', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL,
      pg_catalog.format('fencekit.bypass must be on or off, not %L', raw));
  END IF;
  -- current_user: this function is SECURITY INVOKER, so it is the role doing the write.
  IF pg_catalog.pg_has_role(current_user, 'fencekit_admin', 'MEMBER') THEN
    RETURN true;
  END IF;
  -- The role goes along: inside fencekit.reject (SECURITY DEFINER) current_user is its owner.
  PERFORM fencekit.reject('bypass_refused', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL,
                          current_user::text);
  RETURN false;
END
$fn$;
