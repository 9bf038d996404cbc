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
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"

	"github.com/bulwark-pds/bulwark/budget"
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

// ErrPasswordBusy means a password check got no hash slot: the wait queue
// was full, the client already held its share of it, or the wait ran out.
// Nothing was hashed; retrying shortly may succeed.
var ErrPasswordBusy = errors.New("too many password checks in progress")

// DefaultPasswordHashes is how many password hashes may run at once when
// Config.PasswordHashes is zero: one per core. More at once would add
// memory (each hash holds its 19 MiB) and no throughput.
func DefaultPasswordHashes() int { return max(1, runtime.GOMAXPROCS(0)) }

// Defaults for the password-hash queue (Config.PasswordQueue and
// PasswordWait). A hash takes about 30 ms of one core, so a full queue of
// 64 drains in about a second on two cores: well inside the wait, which
// only runs out when hashes are much slower than that (a machine starved
// of CPU).
const (
	DefaultPasswordQueue = 64
	DefaultPasswordWait  = 5 * time.Second
)

// NewPasswordSlots returns the hash slots and their FIFO wait queue: a
// budget of hashes (capacity) units, each hash taking one, with up to
// queue waiters (zero means DefaultPasswordQueue, negative none). A server
// builds its own to report it in metrics and passes it in
// Config.PasswordSlots.
func NewPasswordSlots(hashes, queue int) *budget.Budget {
	if hashes <= 0 {
		hashes = DefaultPasswordHashes()
	}
	if queue == 0 {
		queue = DefaultPasswordQueue
	}
	return budget.New(budget.Config{Capacity: int64(hashes), MaxQueue: queue, RetryAfter: time.Second})
}

// hasher runs argon2id, at most as many hashes at once as slots has units.
// A check that finds them all taken waits its turn, first come first
// served, for at most wait; a full queue, a client over its share, or a
// wait that runs out fails with ErrPasswordBusy. The queue absorbs the
// bursts real people make (eight sign-ins in the same second) while the
// login limits, applied before a check reaches it, keep guessers out of it.
type hasher struct {
	params PasswordParams
	slots  *budget.Budget
	wait   time.Duration
	// share is how many places (waiting or hashing) one client may hold,
	// half of them all: one address cannot fill the queue for everyone.
	share int
	// derive computes the hash; tests wrap it to see admission order.
	derive func(pw, salt []byte, p PasswordParams) []byte

	mu   sync.Mutex
	held map[string]int // places held, by client
}

func newHasher(p PasswordParams, slots *budget.Budget, wait time.Duration) *hasher {
	if p.Memory == 0 || p.Time == 0 || p.Threads == 0 {
		p = DefaultPasswordParams
	}
	if slots == nil {
		slots = NewPasswordSlots(0, 0)
	}
	if wait <= 0 {
		wait = DefaultPasswordWait
	}
	st := slots.Stats()
	return &hasher{
		params: p, slots: slots, wait: wait,
		share:  max(1, (int(st.Capacity)+st.MaxQueue)/2),
		derive: argon2ID,
		held:   map[string]int{},
	}
}

func argon2ID(pw, salt []byte, p PasswordParams) []byte {
	return argon2.IDKey(pw, salt, p.Time, p.Memory, p.Threads, hashLen)
}

type clientKey struct{}

// WithClient tells the password checks made under ctx who asks (the
// client's address as the rate limits key it), so that one client holds
// at most its share of the hash queue. Checks without one are not
// counted per client (the command line, tests).
func WithClient(ctx context.Context, client string) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

func (h *hasher) run(ctx context.Context, pw, salt []byte, p PasswordParams) ([]byte, error) {
	release, err := h.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return h.derive(pw, salt, p), nil
}

// acquire takes a hash slot, waiting in line for at most h.wait, and
// returns the function that gives it back.
func (h *hasher) acquire(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	client, _ := ctx.Value(clientKey{}).(string)
	if !h.enter(client) {
		return nil, fmt.Errorf("%w: this client already has %d waiting", ErrPasswordBusy, h.share)
	}
	wctx, cancel := context.WithTimeout(ctx, h.wait)
	res, err := h.slots.Acquire(wctx, 1)
	cancel()
	if err != nil {
		h.leave(client)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err() // the client went away
		case errors.Is(err, budget.ErrOverloaded):
			return nil, fmt.Errorf("%w: the queue is full", ErrPasswordBusy)
		default:
			return nil, fmt.Errorf("%w: no slot within %v", ErrPasswordBusy, h.wait)
		}
	}
	return func() {
		res.Release()
		h.leave(client)
	}, nil
}

// enter counts a place for client, unless it holds its share already.
func (h *hasher) enter(client string) bool {
	if client == "" {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[client] >= h.share {
		return false
	}
	h.held[client]++
	return true
}

func (h *hasher) leave(client string) {
	if client == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[client]--; h.held[client] <= 0 {
		delete(h.held, client)
	}
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
// unknown account takes as long as one with a wrong password, and waits
// for a hash slot (or is refused) just as such a login would.
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
