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
	queries         = db.MustParseQueries(queriesSQL)
	qRecordedHost   = queries.MustGet("RecordedHost")
	qRecordHost     = queries.MustGet("RecordHost")
	qHasAccounts    = queries.MustGet("HasAccounts")
	qSampleAccounts = queries.MustGet("SampleAccounts")
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
//     accounts, the DID document of one of the newest active accounts
//     (sampleSize of them, so that one that moved away without being
//     deactivated here is no false alarm) must point at want.PublicURL;
//     it is recorded when one does. When none does, the server is
//     refused; when a resolution fails before any matched, nothing is
//     recorded and the reason comes back in warning.
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
	dids, err := sampleAccounts(ctx, q)
	if err != nil {
		return "", err
	}
	if len(dids) == 0 {
		return "no active account to check the host name against", nil
	}
	var mismatch string
	for _, did := range dids {
		endpoint, err := resolve(ctx, did)
		if err != nil {
			return fmt.Sprintf("could not check the host name against %s's DID document: %v", did, err), nil
		}
		if sameBase(endpoint, want.PublicURL) {
			return "", RecordHost(ctx, q, want)
		}
		if mismatch == "" {
			mismatch = fmt.Sprintf("the DID document of %s, an account here, names %s as its PDS", did, endpoint)
		}
	}
	return "", fmt.Errorf("%w: %s (and no DID document of the %d newest active accounts names this server), and this server's URL is %s (BULWARK_HOSTNAME=%s); "+
		"start it with the host name of the accounts' URL",
		ErrHostMismatch, mismatch, len(dids), want.PublicURL, want.Hostname)
}

// sampleSize is how many accounts CheckHost resolves at most.
const sampleSize = 5

func sampleAccounts(ctx context.Context, q db.DBTX) ([]string, error) {
	rows, err := q.Query(ctx, qSampleAccounts, sampleSize)
	if err != nil {
		return nil, db.Translate(err)
	}
	defer rows.Close()
	var dids []string
	for rows.Next() {
		var did string
		if err := rows.Scan(&did); err != nil {
			return nil, db.Translate(err)
		}
		dids = append(dids, did)
	}
	return dids, db.Translate(rows.Err())
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
