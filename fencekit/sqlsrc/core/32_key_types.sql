-- ------------------------------------------------------------------ key column types

-- Refuses (YF000) unless every key column of a key-fenced table still has a type whose text
-- is computed by built-in code only, and of the family protect recorded (fencekit.protected.
-- key_families). The key fence's SECURITY DEFINER trigger functions (fencekit/sqlgen/key.py)
-- call it before they compute any key's text (k::text), and `fencekit move` before it computes
-- an old key's: the table's owner may retype a key column after protect (ALTER COLUMN ... TYPE,
-- or DROP COLUMN and ADD COLUMN again) to a type of its own whose cast to text is its own
-- code, which must never run with the rights of the role that ran protect. PL/pgSQL plans a
-- statement when it first runs it, so no cast is even looked up before this check returns.
--
-- `tag` names the registry row (the key columns and their families); `relid` is the table the
-- trigger fired on (a partition or child of the protected table has the same key columns).
-- Runs as its caller, reads only the catalogs and fencekit.protected, and evaluates nothing of
-- the table's: no cast, no input or output function, no operator of a user type. Cheap: one
-- index lookup in the registry, one in pg_attribute and pg_type per key column, and the
-- families (fencekit.key_families) only once every column's type is known to be built in.
CREATE OR REPLACE FUNCTION fencekit.check_key_types(tag text, relid regclass) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  p record;
  c record;
  base oid;
  under oid;
  cols text[];
  now_families text[];
BEGIN
  SELECT pr.spec -> 'key' AS key, pr.key_families INTO p
    FROM fencekit.protected pr WHERE pr.tag = check_key_types.tag;
  IF NOT FOUND OR pg_catalog.jsonb_typeof(p.key) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s has the key fence triggers of %L, which '
                                  'fencekit.protected does not list as a key fence: no key is '
                                  'named', relid, tag),
      HINT = 'Re-protect the table (fencekit protect), or unprotect it (fencekit unprotect).';
  END IF;
  cols := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(p.key));
  FOR c IN SELECT u.col, u.o, a.atttypid, a.atttypmod
             FROM pg_catalog.unnest(cols) WITH ORDINALITY AS u(col, o)
             LEFT JOIN pg_catalog.pg_attribute a
               ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                  AND NOT a.attisdropped
            ORDER BY u.o LOOP
    base := c.atttypid;
    LOOP  -- a domain's text is its base type's (a cast from a domain is never used)
      SELECT t.typbasetype INTO under FROM pg_catalog.pg_type t
       WHERE t.oid = base AND t.typtype = 'd';
      EXIT WHEN NOT FOUND;
      base := under;
    END LOOP;
    -- Below FirstNormalObjectId: built in (its cast to text, output function and, for an
    -- array or a composite, its elements' are pg_catalog's, which only a superuser changes).
    IF c.atttypid IS NULL OR base >= 16384 THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I of %s has type %s, but the table '
                                    'was protected with a key of %s: no key text is computed '
                                    'from it', c.col, relid,
                                    COALESCE(pg_catalog.format_type(c.atttypid, c.atttypmod),
                                             '(no such column)'),
                                    COALESCE(p.key_families[c.o], 'a built-in type')),
        HINT = 'Restore the column''s type, or re-protect the table: unprotect it and protect '
               'it again (fencekit unprotect, fencekit protect; its fences restart).',
        COLUMN = c.col;
    END IF;
  END LOOP;
  IF p.key_families IS NULL THEN
    RETURN;  -- protected before the families were recorded: built-in types are all we know
  END IF;
  now_families := fencekit.key_families(relid, cols);
  IF now_families IS DISTINCT FROM p.key_families THEN
    FOR c IN SELECT u.col, u.o, a.atttypid, a.atttypmod
               FROM pg_catalog.unnest(cols) WITH ORDINALITY AS u(col, o)
               JOIN pg_catalog.pg_attribute a
                 ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                    AND NOT a.attisdropped
              WHERE now_families[u.o] IS DISTINCT FROM p.key_families[u.o]
              ORDER BY u.o LIMIT 1 LOOP
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I of %s has type %s, but the table '
                                    'was protected with a key of %s: no key text is computed '
                                    'from it', c.col, relid,
                                    pg_catalog.format_type(c.atttypid, c.atttypmod),
                                    p.key_families[c.o]),
        HINT = 'Restore the column''s type, or re-protect the table: unprotect it and protect '
               'it again (fencekit unprotect, fencekit protect; its fences restart).',
        COLUMN = c.col;
    END LOOP;
  END IF;
END
$fn$;
