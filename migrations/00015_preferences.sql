-- +goose Up

-- An account's app.bsky preferences (app.bsky.actor.getPreferences and
-- putPreferences): one row per preference, in the order the client sent
-- them (id). putPreferences replaces them all at once, except those its
-- session may not touch (personalDetailsPref needs the account password).
CREATE TABLE account_preferences (
    id    bigserial PRIMARY KEY,
    did   text      NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    type  text      NOT NULL, -- the preference's $type
    value jsonb     NOT NULL  -- the whole preference object, $type included
);
CREATE INDEX account_preferences_did ON account_preferences (did, id);

-- +goose Down
DROP TABLE account_preferences;
