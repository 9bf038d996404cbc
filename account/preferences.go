package account

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

// Preferences are what app.bsky.actor.getPreferences and putPreferences
// keep for an account, with the reference PDS's rules: only the app.bsky
// namespace, personalDetailsPref only with the account password, and
// declaredAgePref derived from the birth date, never stored.

//go:embed preferences.sql
var preferencesSQL string

var (
	preferenceQueries  = db.MustParseQueries(preferencesSQL)
	qListPreferences   = preferenceQueries.MustGet("ListPreferences")
	qDeletePreferences = preferenceQueries.MustGet("DeletePreferences")
	qInsertPreferences = preferenceQueries.MustGet("InsertPreferences")
)

// Preference types and bounds.
const (
	// PreferencesNamespace is the only namespace putPreferences accepts.
	PreferencesNamespace = "app.bsky"
	// PrefPersonalDetails holds the birth date: only a session made with
	// the account password reads or writes it.
	PrefPersonalDetails = "app.bsky.actor.defs#personalDetailsPref"
	// PrefDeclaredAge is derived from PrefPersonalDetails when read, and
	// dropped when written.
	PrefDeclaredAge = "app.bsky.actor.defs#declaredAgePref"
	// MaxPreferences bounds how many preferences one account keeps (the
	// request body's size bounds them too).
	MaxPreferences = 1000
	// MaxPreferenceTypeLength bounds a preference's $type.
	MaxPreferenceTypeLength = 512
)

// ErrInvalidPreferences means putPreferences was given preferences it may
// not store: outside app.bsky, without a $type, too many, or one the
// session may not set. The wrapping message says which.
var ErrInvalidPreferences = errors.New("invalid preferences")

// Preference is one stored preference: its $type and the whole JSON
// object, $type included.
type Preference struct {
	Type  string
	Value json.RawMessage
}

// InPreferencesNamespace reports whether a preference $type is in the
// app.bsky namespace.
func InPreferencesNamespace(typ string) bool {
	return typ == PreferencesNamespace || strings.HasPrefix(typ, PreferencesNamespace+".")
}

// Preferences returns did's preferences in the order they were put.
// Without fullAccess (an app-password session) personalDetailsPref is left
// out; a declaredAgePref derived from its birth date is added either way.
func (s *Service) Preferences(ctx context.Context, did syntax.DID, fullAccess bool) ([]Preference, error) {
	rows, err := s.pool.Query(ctx, qListPreferences, did.String())
	if err != nil {
		return nil, fmt.Errorf("reading preferences: %w", db.Translate(err))
	}
	defer rows.Close()
	out := []Preference{}
	var declared *Preference
	for rows.Next() {
		var p Preference
		var value string
		if err := rows.Scan(&p.Type, &value); err != nil {
			return nil, fmt.Errorf("reading preferences: %w", db.Translate(err))
		}
		p.Value = json.RawMessage(value)
		if p.Type == PrefPersonalDetails {
			declared = s.declaredAge(p.Value)
			if !fullAccess {
				continue
			}
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading preferences: %w", db.Translate(err))
	}
	if declared != nil {
		out = append(out, *declared)
	}
	return out, nil
}

// declaredAge derives a declaredAgePref from a personalDetailsPref's
// birthDate, or nil when it has none that parses.
func (s *Service) declaredAge(personal json.RawMessage) *Preference {
	var pd struct {
		BirthDate string `json:"birthDate"`
	}
	if json.Unmarshal(personal, &pd) != nil || pd.BirthDate == "" {
		return nil
	}
	var birth time.Time
	if dt, err := syntax.ParseDatetimeLenient(pd.BirthDate); err == nil {
		birth = dt.Time()
	} else if d, err := time.Parse(time.DateOnly, pd.BirthDate); err == nil {
		birth = d
	} else {
		return nil
	}
	age := ageOn(birth.UTC(), s.cfg.Now().UTC())
	v, err := json.Marshal(map[string]any{
		"$type": PrefDeclaredAge, "isOverAge13": age >= 13, "isOverAge16": age >= 16, "isOverAge18": age >= 18,
	})
	if err != nil {
		return nil
	}
	return &Preference{Type: PrefDeclaredAge, Value: v}
}

// ageOn is the age in whole years on day now of someone born on birth.
func ageOn(birth, now time.Time) int {
	age := now.Year() - birth.Year()
	if now.Month() < birth.Month() || (now.Month() == birth.Month() && now.Day() < birth.Day()) {
		age--
	}
	return age
}

// PutPreferences replaces did's app.bsky preferences with prefs, in their
// order. declaredAgePref is dropped (it is derived). Without fullAccess,
// setting personalDetailsPref is refused and the stored one is kept.
// Every preference must be in the app.bsky namespace (else
// ErrInvalidPreferences, and nothing changes).
func (s *Service) PutPreferences(ctx context.Context, did syntax.DID, prefs []Preference, fullAccess bool) error {
	if len(prefs) > MaxPreferences {
		return ruleErr(ErrInvalidPreferences, "%d preferences: the limit is %d", len(prefs), MaxPreferences)
	}
	types := make([]string, 0, len(prefs))
	values := make([]string, 0, len(prefs))
	var forbidden []string
	for _, p := range prefs {
		switch {
		case p.Type == "":
			return ruleErr(ErrInvalidPreferences, "a preference is missing its $type")
		case len(p.Type) > MaxPreferenceTypeLength:
			return ruleErr(ErrInvalidPreferences, "a preference $type is longer than %d bytes", MaxPreferenceTypeLength)
		case !InPreferencesNamespace(p.Type):
			return ruleErr(ErrInvalidPreferences, "some preferences are not in the %s namespace: %.100q", PreferencesNamespace, p.Type)
		case p.Type == PrefPersonalDetails && !fullAccess:
			forbidden = append(forbidden, p.Type)
		case p.Type == PrefDeclaredAge:
			continue
		}
		types = append(types, p.Type)
		values = append(values, string(p.Value))
	}
	if len(forbidden) > 0 {
		return ruleErr(ErrInvalidPreferences, "this session may not set preferences: %s (sign in with the account password)", strings.Join(forbidden, ", "))
	}
	keep := []string{}
	if !fullAccess {
		keep = append(keep, PrefPersonalDetails)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The account's lock makes concurrent puts apply one after the
		// other instead of interleaving their deletes and inserts.
		if _, _, err := lockAccount(ctx, tx, did); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qDeletePreferences, did.String(), PreferencesNamespace, keep); err != nil {
			return fmt.Errorf("storing preferences: %w", db.Translate(err))
		}
		if len(types) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, qInsertPreferences, did.String(), types, values); err != nil {
			return fmt.Errorf("storing preferences: %w", db.Translate(err))
		}
		return nil
	})
}
