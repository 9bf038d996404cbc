package oauth

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var querySQL string

var queries = db.MustParseQueries(querySQL)

// Statements, resolved once so that a typo fails at start-up.
var (
	qInsertDevice          = queries.MustGet("InsertDevice")
	qMoveDeviceAccounts    = queries.MustGet("MoveDeviceAccounts")
	qMoveDeviceRequests    = queries.MustGet("MoveDeviceRequests")
	qDeleteDevice          = queries.MustGet("DeleteDevice")
	qDeleteDeviceIfUnused  = queries.MustGet("DeleteDeviceIfUnused")
	qTrimAccountDevices    = queries.MustGet("TrimAccountDevices")
	qLockClient            = queries.MustGet("LockClient")
	qCountPending          = queries.MustGet("CountPending")
	qTrimSpentRefresh      = queries.MustGet("TrimSpentRefresh")
	qTrimValues            = queries.MustGet("TrimValues")
	qDeleteExpiredRequests = queries.MustGet("DeleteExpiredRequests")
	qDeviceAccounts        = queries.MustGet("DeviceAccounts")
	qUpsertDeviceAccount   = queries.MustGet("UpsertDeviceAccount")
	qDeleteDeviceAccount   = queries.MustGet("DeleteDeviceAccount")
	qInsertRequest         = queries.MustGet("InsertRequest")
	qGetRequest            = queries.MustGet("GetRequest")
	qBindRequest           = queries.MustGet("BindRequest")
	qApproveRequest        = queries.MustGet("ApproveRequest")
	qDeleteRequest         = queries.MustGet("DeleteRequest")
	qUseCode               = queries.MustGet("UseCode")
	qSpentCodeGrant        = queries.MustGet("SpentCodeGrant")
	qSetRequestGrant       = queries.MustGet("SetRequestGrant")
	qInsertGrant           = queries.MustGet("InsertGrant")
	qTrimClientGrants      = queries.MustGet("TrimClientGrants")
	qClientGrantScopes     = queries.MustGet("ClientGrantScopes")
	qGrantByRefresh        = queries.MustGet("GrantByRefresh")
	qRotateRefresh         = queries.MustGet("RotateRefresh")
	qGrantScopes           = queries.MustGet("GrantScopes")
	qInsertSpentRefresh    = queries.MustGet("InsertSpentRefresh")
	qSpentRefreshGrant     = queries.MustGet("SpentRefreshGrant")
	qDeleteGrant           = queries.MustGet("DeleteGrant")
	qDeleteGrantOfDID      = queries.MustGet("DeleteGrantOfDID")
	qDeleteGrantsOfDID     = queries.MustGet("DeleteGrantsOfDID")
	qDeleteGrantOfClient   = queries.MustGet("DeleteGrantOfClient")
	qGrantIDByRefresh      = queries.MustGet("GrantIDByRefresh")
	qActiveGrant           = queries.MustGet("ActiveGrant")
	qListGrants            = queries.MustGet("ListGrants")
	qUseValue              = queries.MustGet("UseValue")
	qCleanup               = []string{
		qDeleteExpiredRequests,
		queries.MustGet("DeleteExpiredGrants"),
		queries.MustGet("DeleteExpiredSpentRefresh"),
		queries.MustGet("DeleteExpiredValues"),
		queries.MustGet("DeleteExpiredDeviceAccounts"),
		queries.MustGet("DeleteExpiredDevices"),
	}
)

// hashSecret is how codes, refresh tokens and device cookies are stored.
func hashSecret(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// clientAuth records how a client authenticated when a request was made,
// so later requests of the same session must authenticate the same way
// (for confidential clients, with the same key).
type clientAuth struct {
	Method string `json:"method"`
	KeyID  string `json:"kid,omitempty"`
	Alg    string `json:"alg,omitempty"`
	JKT    string `json:"jkt,omitempty"`
}

// requestParams are the validated parameters of a pushed authorization
// request.
type requestParams struct {
	RedirectURI   string `json:"redirect_uri"`
	Scope         string `json:"scope"`
	State         string `json:"state"`
	CodeChallenge string `json:"code_challenge"`
	ResponseMode  string `json:"response_mode"`
	LoginHint     string `json:"login_hint,omitempty"`
	Prompt        string `json:"prompt,omitempty"`
}

// authRequest is a stored authorization request.
type authRequest struct {
	ID         string
	ClientID   string
	Params     requestParams
	JKT        string
	ClientAuth clientAuth
	DeviceID   []byte
	DID        *string
	Approved   bool
	ExpiresAt  time.Time
}

func insertRequest(ctx context.Context, q db.DBTX, r *authRequest) error {
	params, err := json.Marshal(r.Params)
	if err != nil {
		return err
	}
	auth, err := json.Marshal(r.ClientAuth)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, qInsertRequest, r.ID, r.ClientID, params, r.JKT, auth, r.ExpiresAt)
	return db.Translate(err)
}

func getRequest(ctx context.Context, q db.DBTX, id string) (*authRequest, error) {
	var r authRequest
	var params, auth []byte
	err := q.QueryRow(ctx, qGetRequest, id).Scan(&r.ID, &r.ClientID, &params, &r.JKT, &auth, &r.DeviceID, &r.DID, &r.Approved, &r.ExpiresAt)
	if err != nil {
		return nil, db.Translate(err)
	}
	if err := json.Unmarshal(params, &r.Params); err != nil {
		return nil, fmt.Errorf("request %s params: %w", id, err)
	}
	if err := json.Unmarshal(auth, &r.ClientAuth); err != nil {
		return nil, fmt.Errorf("request %s client auth: %w", id, err)
	}
	return &r, nil
}

// execOne runs a statement that returns a row when it applied, and maps
// "no row" to db.ErrNotFound.
func execOne(ctx context.Context, q db.DBTX, sql string, args ...any) error {
	var ignored any
	return db.Translate(q.QueryRow(ctx, sql, args...).Scan(&ignored))
}

// usedCode is what the token endpoint learns from an authorization code.
type usedCode struct {
	RequestID  string
	ClientID   string
	Params     requestParams
	JKT        string
	ClientAuth clientAuth
	DID        syntax.DID
	// TokenScope is the scope with its permission sets expanded at
	// approval.
	TokenScope string
}

func useCode(ctx context.Context, q db.DBTX, code string) (*usedCode, error) {
	var c usedCode
	var params, auth []byte
	var did, tokenScope *string
	err := q.QueryRow(ctx, qUseCode, hashSecret(code)).Scan(&c.RequestID, &c.ClientID, &params, &c.JKT, &auth, &did, &tokenScope)
	if err != nil {
		return nil, db.Translate(err)
	}
	if did == nil {
		return nil, fmt.Errorf("request %s has a code but no account", c.RequestID)
	}
	c.DID = syntax.DID(*did)
	if err := json.Unmarshal(params, &c.Params); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(auth, &c.ClientAuth); err != nil {
		return nil, err
	}
	c.TokenScope = c.Params.Scope
	if tokenScope != nil {
		c.TokenScope = *tokenScope
	}
	return &c, nil
}

// grant is a stored grant.
type grant struct {
	ID       string
	DID      syntax.DID
	ClientID string
	// Scope is what the person allowed, as the app asked for it;
	// TokenScope is that with its permission sets (include:) expanded.
	Scope       string
	TokenScope  string
	JKT         string
	ClientAuth  clientAuth
	ExpiresAt   time.Time
	CreatedAt   time.Time
	RefreshedAt time.Time
}

func insertGrant(ctx context.Context, q db.DBTX, g *grant, refreshToken string) error {
	auth, err := json.Marshal(g.ClientAuth)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, qInsertGrant, g.ID, string(g.DID), g.ClientID, g.Scope, g.JKT, auth, hashSecret(refreshToken), g.ExpiresAt, g.TokenScope)
	if err != nil {
		return db.Translate(err)
	}
	_, err = q.Exec(ctx, qTrimClientGrants, string(g.DID), g.ClientID, maxGrantsPerClient)
	return db.Translate(err)
}

type rowScanner interface{ Scan(dest ...any) error }

func scanGrant(row rowScanner) (*grant, error) {
	var g grant
	var did string
	var auth []byte
	if err := row.Scan(&g.ID, &did, &g.ClientID, &g.Scope, &g.TokenScope, &g.JKT, &auth, &g.ExpiresAt, &g.CreatedAt, &g.RefreshedAt); err != nil {
		return nil, db.Translate(err)
	}
	g.DID = syntax.DID(did)
	if err := json.Unmarshal(auth, &g.ClientAuth); err != nil {
		return nil, fmt.Errorf("grant %s client auth: %w", g.ID, err)
	}
	return &g, nil
}

// grantByRefresh locks the grant whose current refresh token is token.
func grantByRefresh(ctx context.Context, q db.DBTX, token string) (*grant, error) {
	return scanGrant(q.QueryRow(ctx, qGrantByRefresh, hashSecret(token)))
}

// rotateRefresh replaces the grant's refresh token and remembers the old
// one as spent until the grant could have expired anyway (the last
// maxSpentPerGrant of them: a client refreshing in a loop must not grow
// the table without bound).
func rotateRefresh(ctx context.Context, q db.DBTX, g *grant, oldToken, newToken string, expires time.Time) error {
	if err := execOne(ctx, q, qRotateRefresh, g.ID, hashSecret(oldToken), hashSecret(newToken), expires, g.TokenScope); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, qInsertSpentRefresh, hashSecret(oldToken), g.ID, expires); err != nil {
		return db.Translate(err)
	}
	_, err := q.Exec(ctx, qTrimSpentRefresh, g.ID, maxSpentPerGrant)
	return db.Translate(err)
}

// spentGrant returns the grant a spent refresh token (or used code)
// belonged to, or db.ErrNotFound.
func spentGrant(ctx context.Context, q db.DBTX, sql string, secret string) (string, error) {
	var id *string
	if err := q.QueryRow(ctx, sql, hashSecret(secret)).Scan(&id); err != nil {
		return "", db.Translate(err)
	}
	if id == nil {
		return "", db.ErrNotFound
	}
	return *id, nil
}

func listGrants(ctx context.Context, q db.DBTX, did syntax.DID, limit int) ([]*grant, error) {
	rows, err := q.Query(ctx, qListGrants, string(did), limit)
	if err != nil {
		return nil, db.Translate(err)
	}
	defer rows.Close()
	var out []*grant
	for rows.Next() {
		g, err := scanGrant(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, db.Translate(rows.Err())
}

// useValue records a single-use value of a kind until expires, and reports
// ErrReused if it was already recorded.
func useValue(ctx context.Context, q db.DBTX, kind, value string, expires time.Time) error {
	err := execOne(ctx, q, qUseValue, kind, hashSecret(value), expires)
	if errors.Is(err, db.ErrNotFound) {
		return errReused
	}
	return err
}

var errReused = errors.New("value already used")

func deviceAccounts(ctx context.Context, q db.DBTX, device []byte) ([]syntax.DID, error) {
	rows, err := q.Query(ctx, qDeviceAccounts, device)
	if err != nil {
		return nil, db.Translate(err)
	}
	defer rows.Close()
	var out []syntax.DID
	for rows.Next() {
		var did string
		if err := rows.Scan(&did); err != nil {
			return nil, db.Translate(err)
		}
		out = append(out, syntax.DID(did))
	}
	return out, db.Translate(rows.Err())
}

// Cleanup deletes expired requests, grants, spent tokens, single-use
// values and device sessions, browsers no one is signed in on any more,
// and the oldest single-use values beyond MaxUsedValues. Call it every
// few minutes (Run does).
func (s *Server) Cleanup(ctx context.Context) error {
	for _, sql := range qCleanup {
		if _, err := s.db.Exec(ctx, sql); err != nil {
			return fmt.Errorf("oauth cleanup: %w", db.Translate(err))
		}
	}
	if err := s.trimValues(ctx); err != nil {
		return fmt.Errorf("oauth cleanup: %w", err)
	}
	return nil
}
