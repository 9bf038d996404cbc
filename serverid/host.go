package serverid

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var (
	queries        = db.MustParseQueries(queriesSQL)
	qRecordedHost  = queries.MustGet("RecordedHost")
	qRecordHost    = queries.MustGet("RecordHost")
	qHasAccounts   = queries.MustGet("HasAccounts")
	qSampleAccount = queries.MustGet("SampleAccount")
)

// Host is the host name a database's accounts are served under.
type Host struct {
	Hostname  string
	PublicURL string
}

// ErrNoHost means the database records no host: no server of this
// version has started on it.
var ErrNoHost = errors.New("no host recorded")

// RecordedHost reads the host recorded in the database.
func RecordedHost(ctx context.Context, q db.DBTX) (Host, error) {
	var h Host
	err := db.Translate(q.QueryRow(ctx, qRecordedHost).Scan(&h.Hostname, &h.PublicURL))
	if errors.Is(err, db.ErrNotFound) {
		return Host{}, ErrNoHost
	}
	return h, err
}

// RecordHost records h as the database's host.
func RecordHost(ctx context.Context, q db.DBTX, h Host) error {
	_, err := q.Exec(ctx, qRecordHost, h.Hostname, h.PublicURL)
	return db.Translate(err)
}

// ErrHostMismatch means the configured host is not the one the accounts
// of the database are served under.
var ErrHostMismatch = errors.New("host name does not match this database's accounts")

// Resolver returns the PDS endpoint the DID document of did names.
type Resolver func(ctx context.Context, did string) (string, error)

// CheckHost compares the configured host with the database's at start,
// at the cost of one indexed read (and, once, one DID resolution):
//
//   - a recorded host must match, unless the database has no accounts
//     (then the new host is recorded);
//   - with none recorded (a database from before the record) and
//     accounts, the newest active account's DID document must point at
//     want.PublicURL; it is recorded when it does. A resolution that
//     fails leaves nothing recorded and returns the reason in warning.
//
// A mismatch is an error wrapping ErrHostMismatch.
func CheckHost(ctx context.Context, q db.DBTX, want Host, resolve Resolver) (warning string, err error) {
	rec, err := RecordedHost(ctx, q)
	if err != nil && !errors.Is(err, ErrNoHost) {
		return "", err
	}
	if err == nil && rec.Hostname == want.Hostname {
		return "", nil
	}
	hasAccounts, err2 := HasAccounts(ctx, q)
	if err2 != nil {
		return "", err2
	}
	if !hasAccounts {
		return "", RecordHost(ctx, q, want)
	}
	if err == nil {
		return "", fmt.Errorf("%w: the accounts here are served as %s (their DID documents point at %s), and this server is configured as %s; "+
			"start it with BULWARK_HOSTNAME=%s (--hostname): under another name every account would point clients at a server that is not this one",
			ErrHostMismatch, rec.Hostname, rec.PublicURL, want.Hostname, rec.Hostname)
	}
	var did string
	if err := q.QueryRow(ctx, qSampleAccount).Scan(&did); err != nil {
		if errors.Is(db.Translate(err), db.ErrNotFound) {
			return "no active account to check the host name against", nil
		}
		return "", db.Translate(err)
	}
	endpoint, err := resolve(ctx, did)
	if err != nil {
		return fmt.Sprintf("could not check the host name against %s's DID document: %v", did, err), nil
	}
	if !sameBase(endpoint, want.PublicURL) {
		return "", fmt.Errorf("%w: the DID document of %s, an account here, names %s as its PDS, and this server's URL is %s (BULWARK_HOSTNAME=%s); "+
			"start it with the host name of that URL",
			ErrHostMismatch, did, endpoint, want.PublicURL, want.Hostname)
	}
	return "", RecordHost(ctx, q, want)
}

func sameBase(a, b string) bool {
	ca, errA := CanonicalURL(a)
	cb, errB := CanonicalURL(b)
	return errA == nil && errB == nil && ca == cb
}

// HasAccounts reports whether the database hosts any account.
func HasAccounts(ctx context.Context, q db.DBTX) (bool, error) {
	var has bool
	err := q.QueryRow(ctx, qHasAccounts).Scan(&has)
	return has, db.Translate(err)
}
