-- name: ListPreferences
SELECT type, value::text FROM account_preferences WHERE did = $1 ORDER BY id;

-- name: DeletePreferences
-- Every preference of the account in namespace $2 except the types in $3
-- (those the session may not change).
DELETE FROM account_preferences
WHERE did = $1
  AND (type = $2 OR starts_with(type, $2 || '.'))
  AND NOT (type = ANY ($3::text[]));

-- name: InsertPreferences
-- $2 and $3 are parallel arrays of types and JSON values; ids follow their
-- order, which is the order getPreferences answers in.
INSERT INTO account_preferences (did, type, value)
SELECT $1, p.type, p.value::jsonb
FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS p(type, value, n)
ORDER BY p.n;
