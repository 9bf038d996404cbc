-- +goose Up

-- The write guard's refusal, called only when the session check fails:
-- the check itself is now a plain statement (account/queries.sql
-- CheckSessionGuard), planned and cached once per connection like any
-- other, instead of a PL/pgSQL function running its query through SPI on
-- every write (bulwark_check_session: ~60 µs a call at 16 writers, most of
-- it the function's own overhead).
-- +goose StatementBegin
CREATE FUNCTION bulwark_refuse_session(p_did text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'session of % is over or the account is not active', p_did USING ERRCODE = 'BW002';
END
$$;
-- +goose StatementEnd
DROP FUNCTION bulwark_check_session(text, text);

-- +goose Down
DROP FUNCTION bulwark_refuse_session(text);
-- +goose StatementBegin
CREATE FUNCTION bulwark_check_session(p_did text, p_session text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM accounts a
        WHERE a.did = p_did AND a.status = 'active'
          AND EXISTS (SELECT 1 FROM refresh_tokens r
                      WHERE r.session_id = p_session AND r.did = a.did AND r.expires_at > now())
    ) THEN
        RAISE EXCEPTION 'session of % is over or the account is not active', p_did USING ERRCODE = 'BW002';
    END IF;
END
$$;
-- +goose StatementEnd
