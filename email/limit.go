package email

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Mail to one address is limited (Config.RecipientLimit), whichever
// account or flow asks for it: every code mail counts, an administrator's
// message neither counts nor is refused (the operator is accountable for
// it, and no one else can send one).

// ErrRecipientLimited is wrapped by every *RecipientLimitError.
var ErrRecipientLimited = errors.New("too much mail to this address")

// RecipientLimitError refuses a mail to an address that was sent as much
// as Config.RecipientLimit allows. Nothing was queued or issued.
type RecipientLimitError struct {
	// Decision is the limiter's: the rule that refused and when a mail
	// would be allowed again.
	Decision ratelimit.Decision
}

func (e *RecipientLimitError) Error() string {
	return fmt.Sprintf("too much mail to this address (%d per %s); retry in %s",
		e.Decision.Rule.Limit, e.Decision.Rule.Window, e.Decision.RetryAfter.Round(time.Second))
}

// Unwrap makes errors.Is(err, ErrRecipientLimited) true.
func (e *RecipientLimitError) Unwrap() error { return ErrRecipientLimited }

// RecipientKey is the rate-limit key of an address: lower case, without
// a trailing dot on the domain, without a "+tag" on the local part, and
// for Gmail without the dots it ignores, so that the spellings of one
// mailbox share one limit.
func RecipientKey(addr string) string {
	addr = strings.ToLower(strings.TrimSpace(addr))
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return addr
	}
	local, domain := addr[:at], strings.TrimSuffix(addr[at+1:], ".")
	if i := strings.IndexByte(local, '+'); i > 0 {
		local = local[:i]
	}
	if domain == "googlemail.com" {
		domain = "gmail.com"
	}
	if domain == "gmail.com" {
		local = strings.ReplaceAll(local, ".", "")
	}
	return local + "@" + domain
}

// admit spends one mail of the address to under Config.RecipientLimit,
// or refuses it; an admin message is never limited.
func (m *Mailer) admit(kind Kind, to string) error {
	if kind == KindAdminMessage || m.cfg.RecipientLimit == nil {
		return nil
	}
	if d := m.cfg.RecipientLimit.AllowN(RecipientKey(to), 1); !d.Allowed {
		return &RecipientLimitError{Decision: d}
	}
	return nil
}
