-- name: Prune
-- Deletes a few expired uses, so that the table holds only tokens that
-- could still be presented, at a bounded cost per new use.
DELETE FROM service_auth_used
WHERE (purpose, iss, jti) IN (
    SELECT purpose, iss, jti FROM service_auth_used
    WHERE expires_at < $1
    ORDER BY expires_at
    LIMIT 16
);

-- name: Spend
-- Records a use, unless the token was used for this purpose already (no
-- row inserted). A concurrent use waits for the first one's transaction
-- and finds its row if that commits.
INSERT INTO service_auth_used (purpose, iss, jti, expires_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (purpose, iss, jti) DO NOTHING;

-- name: Unspend
DELETE FROM service_auth_used WHERE purpose = $1 AND iss = $2 AND jti = $3;
