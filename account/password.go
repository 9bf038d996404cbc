package account

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"
)

// Password rules for new passwords. The minimum is the usual floor; the
// maximum matches the reference PDS (NEW_PASSWORD_MAX_LENGTH) and bounds the
// work one request can ask of the KDF.
const (
	MinPasswordLength = 8
	MaxPasswordLength = 256
)

// PasswordParams are argon2id's cost parameters.
type PasswordParams struct {
	// Memory in KiB.
	Memory uint32
	// Time is the number of passes.
	Time uint32
	// Threads is the parallelism.
	Threads uint8
}

// DefaultPasswordParams are OWASP's recommended argon2id settings (19 MiB,
// 2 passes, 1 thread): about 30 ms per hash on one core.
var DefaultPasswordParams = PasswordParams{Memory: 19 * 1024, Time: 2, Threads: 1}

const (
	saltLen = 16
	hashLen = 32
)

// ErrPasswordBusy means every password-hash slot is taken: the check was
// refused at once, without hashing. Retrying shortly may succeed.
var ErrPasswordBusy = errors.New("too many password checks in progress")

// DefaultPasswordHashes is how many password hashes may run at once when
// Config.PasswordHashes is zero: one per core. More at once would add
// memory (each hash holds its 19 MiB) and no throughput; a flood of
// logins past it is refused at once instead of queueing on the CPU, and
// the login limits (per address, per account) keep guessers to a trickle.
func DefaultPasswordHashes() int { return max(1, runtime.GOMAXPROCS(0)) }

// hasher runs argon2id with a bound on how many hashes run at once. One
// more is refused at once (ErrPasswordBusy) rather than queued: a queue
// of hashes is a queue of clients waiting on the CPU, and a flood of
// guesses would make it grow without bound.
type hasher struct {
	params PasswordParams
	slots  chan struct{}
}

func newHasher(p PasswordParams, slots int) *hasher {
	if p.Memory == 0 || p.Time == 0 || p.Threads == 0 {
		p = DefaultPasswordParams
	}
	if slots <= 0 {
		slots = DefaultPasswordHashes()
	}
	return &hasher{params: p, slots: make(chan struct{}, slots)}
}

func (h *hasher) run(ctx context.Context, pw, salt []byte, p PasswordParams) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case h.slots <- struct{}{}:
	default:
		return nil, ErrPasswordBusy
	}
	defer func() { <-h.slots }()
	return argon2.IDKey(pw, salt, p.Time, p.Memory, p.Threads, hashLen), nil
}

// checkNewPassword applies the rules for a new password.
func checkNewPassword(pw string) error {
	n := utf8.RuneCountInString(pw)
	switch {
	case n < MinPasswordLength:
		return ruleErr(ErrInvalidPassword, "password is too short: use at least %d characters", MinPasswordLength)
	case len(pw) > MaxPasswordLength:
		return ruleErr(ErrInvalidPassword, "password is too long: the maximum is %d bytes", MaxPasswordLength)
	case strings.TrimSpace(pw) == "":
		return ruleErr(ErrInvalidPassword, "password must not be blank")
	}
	return nil
}

// hash returns pw's argon2id hash in the PHC string format, which records
// the parameters so they can be raised later without breaking old hashes.
func (h *hasher) hash(ctx context.Context, pw string) (string, error) {
	salt := make([]byte, saltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	p := h.params
	sum, err := h.run(ctx, []byte(pw), salt, p)
	if err != nil {
		return "", err
	}
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.Memory, p.Time, p.Threads,
		b64.EncodeToString(salt), b64.EncodeToString(sum)), nil
}

// verify reports whether pw matches the PHC-format hash encoded.
func (h *hasher) verify(ctx context.Context, pw, encoded string) (bool, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errors.New("unsupported password hash format")
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return false, fmt.Errorf("unsupported argon2 version %q", parts[2])
	}
	var p PasswordParams
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &p.Memory, &p.Time, &p.Threads); err != nil {
		return false, fmt.Errorf("bad argon2 parameters %q", parts[3])
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(parts[4])
	if err != nil {
		return false, err
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil {
		return false, err
	}
	got, err := h.run(ctx, []byte(pw), salt, p)
	if err != nil {
		return false, err
	}
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// dummyVerify spends the time of one verification, so that a login for an
// unknown account takes as long as one with a wrong password, and is
// refused when the hash slots are full just as such a login would be.
func (h *hasher) dummyVerify(ctx context.Context, pw string) error {
	_, err := h.run(ctx, []byte(pw), make([]byte, saltLen), h.params)
	return err
}

// appPasswordHash hashes an app password deterministically, salted with the
// account's DID: app passwords are random (about 80 bits), so a per-password
// salt adds nothing, and a deterministic hash lets a login find the app
// password with one hash and one indexed lookup.
func (h *hasher) appPasswordHash(ctx context.Context, did, pw string) ([]byte, error) {
	salt := sha256.Sum256([]byte("bulwark app password\x00" + did))
	return h.run(ctx, []byte(pw), salt[:saltLen], h.params)
}
