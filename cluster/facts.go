package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/db"
)

// Fact is something every node of a cluster must agree on: a fingerprint
// of a secret, or which blob store holds the blobs. Join refuses a node
// whose fact differs from a running node's.
type Fact struct {
	// Name keys the fact ("jwt-secret").
	Name string
	// Value is compared; it is stored in the database, so for a secret it
	// is a Fingerprint, never the secret.
	Value string
	// What names the setting in messages: "the JWT secret (--jwt-secret,
	// BULWARK_JWT_SECRET)".
	What string
	// Hint says what to do about a disagreement.
	Hint string
	// Public facts are no secret: messages show both values.
	Public bool
	// Permanent facts must also equal the value the database recorded
	// when the first node joined, whether or not another node runs now:
	// a key that sealed data must never change.
	Permanent bool
}

// MismatchError is Join's refusal: the facts this node disagrees on.
type MismatchError struct {
	Problems []string
}

func (e *MismatchError) Error() string {
	return "this node disagrees with the other nodes on this database and will not start:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// Fingerprint is an HMAC-SHA256 of value for purpose, keyed with key (the
// PLC rotation key, which every node must share anyway): comparable
// between nodes, but telling nothing about value to whoever reads the
// database without the key, even a guessable admin password.
func Fingerprint(key []byte, purpose string, value []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("bulwark cluster fingerprint v1\x00" + purpose + "\x00"))
	m.Write(value)
	return hex.EncodeToString(m.Sum(nil)[:16])
}

func factMap(facts []Fact) map[string]string {
	m := make(map[string]string, len(facts))
	for _, f := range facts {
		m[f.Name] = f.Value
	}
	return m
}

// checkFacts compares facts with the running nodes' and the database's
// permanent ones, recording a permanent fact the database does not have
// yet.
func checkFacts(ctx context.Context, q db.DBTX, me string, facts []Fact, others []runningNode) error {
	var problems []string
	for _, f := range facts {
		if f.Permanent {
			p, err := checkPermanent(ctx, q, me, f)
			if err != nil {
				return err
			}
			if p != "" {
				problems = append(problems, p)
				continue
			}
		}
		for _, o := range others {
			if v, ok := o.facts[f.Name]; ok && v != f.Value {
				what := f.What
				if f.Public {
					what = fmt.Sprintf("%s (here: %s; there: %s)", f.What, f.Value, v)
				}
				problems = append(problems, fmt.Sprintf("%s differs from what %s uses. %s", what, o, f.Hint))
				break
			}
		}
	}
	if len(problems) > 0 {
		return &MismatchError{Problems: problems}
	}
	return nil
}

// checkPermanent compares f with the database's record of it, recording
// it when there is none. It returns the problem, or "".
func checkPermanent(ctx context.Context, q db.DBTX, me string, f Fact) (string, error) {
	var val, setBy string
	var at time.Time
	err := db.Translate(q.QueryRow(ctx, qGetFact, f.Name).Scan(&val, &setBy, &at))
	switch {
	case errors.Is(err, db.ErrNotFound):
		if _, err := q.Exec(ctx, qSetFact, f.Name, f.Value, me); err != nil {
			return "", fmt.Errorf("recording %s: %w", f.Name, db.Translate(err))
		}
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading %s: %w", f.Name, err)
	case val != f.Value:
		return fmt.Sprintf("%s is not the one this database was first served with (by node %s, recorded %s). %s",
			f.What, setBy, at.UTC().Format(time.RFC3339), f.Hint), nil
	}
	return "", nil
}
