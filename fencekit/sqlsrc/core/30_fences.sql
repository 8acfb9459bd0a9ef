-- Key and table fences: advancing the high-water mark and checking writes against it.

-- Raise the fence of each key to the token, in one atomic upsert whose condition is the
-- comparison, so two concurrent transactions can never leave a fence below an accepted token.
-- Rows are locked in key order (no deadlocks between multi-key writers) and stay locked until
-- commit, so a lower token cannot commit after a higher one on the same key.
-- Returns the first offending key (highest fence first), or NULLs when every key accepts.
CREATE OR REPLACE FUNCTION fencekit.advance_fences(
  resource text, keys text[], token bigint, on_equal text,
  OUT bad_key text, OUT bad_fence bigint, OUT bad_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  me xid8 := pg_catalog.pg_current_xact_id();
BEGIN
  IF pg_catalog.array_position(keys, NULL) IS NOT NULL THEN
    bad_reason := 'null_key';
    RETURN;
  END IF;
  INSERT INTO fencekit.fences AS f (resource, key, fence, writer_xact)
  SELECT DISTINCT advance_fences.resource, k, token, me
    FROM pg_catalog.unnest(keys) AS k
   ORDER BY 2
  ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
     SET fence = excluded.fence, writer_xact = excluded.writer_xact, updated_at = pg_catalog.now()
   WHERE f.fence < excluded.fence;
  SELECT f.key, f.fence, CASE WHEN f.fence > token THEN 'stale' ELSE 'reused' END
    INTO bad_key, bad_fence, bad_reason
    FROM fencekit.fences f
   WHERE f.resource = advance_fences.resource
     AND f.key = ANY (keys)
     AND (f.fence > token
          OR (on_equal = 'reject' AND f.fence = token AND f.writer_xact IS DISTINCT FROM me))
   ORDER BY f.fence DESC
   LIMIT 1;
END
$fn$;

-- The highest fence of a resource (TRUNCATE must present a token not lower than it).
CREATE OR REPLACE FUNCTION fencekit.max_fence(resource text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.max(f.fence) FROM fencekit.fences f WHERE f.resource = max_fence.resource
$fn$;

-- The current fence of one key ('' for a table fence); NULL when none was set.
CREATE OR REPLACE FUNCTION fencekit.current_fence(resource text, key text DEFAULT '') RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT f.fence FROM fencekit.fences f
   WHERE f.resource = current_fence.resource AND f.key = current_fence.key
$fn$;

-- Bind a named resource to the issuer whose tokens it takes. Protecting a second table with the
-- same resource and another issuer is an error: their tokens are not comparable.
CREATE OR REPLACE FUNCTION fencekit.bind_resource(resource text, issuer text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
  bound text;
BEGIN
  INSERT INTO fencekit.resources AS r (resource, issuer)
  VALUES (bind_resource.resource, bind_resource.issuer)
  ON CONFLICT (resource) DO NOTHING;
  SELECT r.issuer INTO bound FROM fencekit.resources r WHERE r.resource = bind_resource.resource;
  IF bound IS DISTINCT FROM bind_resource.issuer THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: resource %L takes tokens from issuer %L, not %L',
                                  bind_resource.resource, COALESCE(bound, 'any'),
                                  COALESCE(bind_resource.issuer, 'any')),
      HINT = 'Tokens of different issuers are never comparable; use another resource name.';
  END IF;
END
$fn$;

-- Row-fence slow paths, called by generated row triggers only when a write has no token or
-- would be rejected. SECURITY INVOKER: bypass is judged for the role doing the write.

-- No token on a row write: true when bypassed (the row passes as written), false when the
-- on_missing policy allows it; otherwise raises YF003.
CREATE OR REPLACE FUNCTION fencekit.unfenced_row(tag text, relid oid, trigger_name text, allow boolean)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF fencekit.bypass_allowed(tag, relid, trigger_name) THEN
    RETURN true;
  END IF;
  IF allow THEN
    RETURN false;
  END IF;
  PERFORM fencekit.reject('missing', tag, relid, trigger_name, NULL, NULL, NULL, NULL, NULL);
  RETURN false;
END
$fn$;

-- A row write that the comparison rejects: true when bypassed (counted), else raises.
CREATE OR REPLACE FUNCTION fencekit.rejected_row(
  reason text, tag text, relid oid, trigger_name text, column_name text, row_data jsonb,
  token bigint, fence bigint)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF fencekit.bypass_allowed(tag, relid, trigger_name) THEN
    PERFORM fencekit.count_event(tag, 'bypassed');
    RETURN true;
  END IF;
  PERFORM fencekit.reject(reason, tag, relid, trigger_name, column_name, NULL,
                          fencekit.row_key(relid, row_data), token, fence);
  RETURN false;
END
$fn$;

-- Advancing fences is for writers of protected tables (the triggers run as the writer), not for
-- anyone who can connect: GRANT fencekit_writer TO app_role.
REVOKE ALL ON FUNCTION fencekit.advance_fences(text, text[], bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.advance_fences(text, text[], bigint, text) TO fencekit_writer;
