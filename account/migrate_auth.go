package account

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

// Service-auth JWTs accepted by this server work once: each accepted
// token's jti is recorded, per purpose and issuer, until it expires.

var (
	qPruneServiceAuthUsed  = migrateQueries.MustGet("PruneServiceAuthUsed")
	qInsertServiceAuthUsed = migrateQueries.MustGet("InsertServiceAuthUsed")
)

// MaxJTILen bounds the jti of a service-auth JWT this server accepts (the
// reference PDS's are 32 hex digits, indigo's 22 base64 characters).
const MaxJTILen = 128

// ErrServiceAuthReplayed means a service-auth JWT was accepted before, for
// the same purpose: a token works once.
var ErrServiceAuthReplayed = errors.New("service-auth token already used")

// ServiceAuthUse is one accepted service-auth JWT, as recorded.
type ServiceAuthUse struct {
	// Purpose is what the token was accepted for: the method (its lxm).
	Purpose string
	// Issuer is the token's iss.
	Issuer syntax.DID
	// JTI is the token's jti: 1 to MaxJTILen printable ASCII characters.
	JTI string
	// Expires is the token's exp; the record is kept until then.
	Expires time.Time
}

// UseServiceAuth records u through q, which should be the transaction of
// the request the token authorises (a refused request then records
// nothing, and its client may try again with the same token). A token
// recorded before for the same purpose and issuer is
// ErrServiceAuthReplayed. Expired records are pruned first.
func UseServiceAuth(ctx context.Context, q db.DBTX, u ServiceAuthUse, now time.Time) error {
	if err := checkJTI(u.JTI); err != nil {
		return err
	}
	if u.Purpose == "" || u.Issuer == "" || u.Expires.IsZero() {
		return fmt.Errorf("account: incomplete service-auth use %+v", u)
	}
	if _, err := q.Exec(ctx, qPruneServiceAuthUsed, now); err != nil {
		return fmt.Errorf("pruning used service-auth tokens: %w", db.Translate(err))
	}
	tag, err := q.Exec(ctx, qInsertServiceAuthUsed, u.Purpose, u.Issuer.String(), u.JTI, u.Expires)
	if err != nil {
		return fmt.Errorf("recording a used service-auth token: %w", db.Translate(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s's token %.16q for %s", ErrServiceAuthReplayed, u.Issuer, u.JTI, u.Purpose)
	}
	return nil
}

// checkJTI refuses a jti that is empty, longer than MaxJTILen or not
// printable ASCII: it is stored and keyed on.
func checkJTI(jti string) error {
	if jti == "" || len(jti) > MaxJTILen {
		return fmt.Errorf("account: service-auth jti must be 1 to %d characters", MaxJTILen)
	}
	for i := range len(jti) {
		if c := jti[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("account: service-auth jti must be printable ASCII")
		}
	}
	return nil
}

// ValidJTI reports whether jti may be recorded (UseServiceAuth).
func ValidJTI(jti string) bool { return checkJTI(jti) == nil }
