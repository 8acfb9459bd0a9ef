-- Lease-bound fences: a write is accepted only if its token is also the live lease token of the
-- resource it writes (besides not being lower than the fence). That closes the window the plain
-- scheme leaves open (A with 33 writing after B acquired 34 but before B wrote) and stops a
-- token for one resource being used on another.

-- The lease resource of a key of a fenced resource: '<resource>:<key>', or the resource itself
-- for a table fence (key ''). PL/pgSQL, not SQL: a SQL function with a SET clause is never
-- inlined and plans its body on every call (once per key of every lease-bound write).
CREATE OR REPLACE FUNCTION fencekit.lease_resource(resource text, key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RETURN CASE WHEN key = '' THEN resource ELSE resource || ':' || key END;
END
$fn$;

-- The first key (in key order, the order leases are locked in) whose lease is not live under
-- exactly this token, with that lease's live token (NULL when nobody holds it); NULLs when all
-- match. fencekit.lease_token() locks each lease row FOR SHARE until the writer commits.
-- SECURITY INVOKER: its callers, the trigger functions of lease-bound
-- fences and fencekit.claim, are SECURITY DEFINER functions owned by a superuser or a member of
-- fencekit_admin, who may call lease_token; nobody else may call it (grants below).
CREATE OR REPLACE FUNCTION fencekit.lease_mismatch(
  resource text, keys text[], token bigint, OUT bad_key text, OUT lease_token bigint)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  k text;
  live bigint;
BEGIN
  FOR k IN SELECT DISTINCT u FROM pg_catalog.unnest(keys) AS u ORDER BY u LOOP
    live := fencekit.lease_token(fencekit.lease_resource(lease_mismatch.resource, k));
    IF live IS DISTINCT FROM token THEN
      bad_key := k;
      lease_token := live;
      RETURN;
    END IF;
  END LOOP;
END
$fn$;

-- It locks lease rows (through lease_token): only for the definer trigger functions of
-- lease-bound fences (owned by whoever ran protect: a superuser or a member of fencekit_admin).
REVOKE ALL ON FUNCTION fencekit.lease_mismatch(text, text[], bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.lease_mismatch(text, text[], bigint) TO fencekit_admin;
