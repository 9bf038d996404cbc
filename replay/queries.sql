-- name: Spend
-- Records a token as used, unless it already was (no row returned), and
-- deletes a few expired ones on the way, so that the table holds only
-- tokens that could still be presented.
WITH pruned AS (
    DELETE FROM spent_service_tokens
    WHERE (issuer, token_id) IN (
        SELECT issuer, token_id FROM spent_service_tokens
        WHERE expires_at < now()
        LIMIT 16
    )
)
INSERT INTO spent_service_tokens (issuer, token_id, expires_at)
VALUES ($1, $2, $3)
ON CONFLICT (issuer, token_id) DO NOTHING
RETURNING 1;

-- name: Unspend
DELETE FROM spent_service_tokens WHERE issuer = $1 AND token_id = $2;
