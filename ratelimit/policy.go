package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Day is the window of the daily rules.
const Day = 24 * time.Hour

// Write costs in points against the per-account write limits, as in the
// reference PDS.
const (
	WriteCostCreate = 3
	WriteCostUpdate = 2
	WriteCostDelete = 1
)

// Limiter names of the reference PDS's policies, the keys of
// DefaultPolicies. They name the limiters in metrics.
const (
	// PolicyGlobal applies to every XRPC request, keyed by client IP.
	PolicyGlobal = "global"
	// PolicyGetRepo replaces the global limit for sync.getRepo, keyed by IP.
	PolicyGetRepo = "getRepo"
	// PolicyCreateSession is the login budget of one account, keyed by
	// its DID whatever identifier (handle, email, DID) names it; a login
	// for no account is keyed by its normalised identifier.
	PolicyCreateSession = "createSession"
	// PolicyLoginAddress is the login budget of one address (an IPv6 /64),
	// whatever accounts it tries: each password check costs a memory-hard
	// hash.
	PolicyLoginAddress = "loginAddress"
	// PolicyAdminAuth counts failed admin authentications per address;
	// past it even the right password is refused until the window allows.
	PolicyAdminAuth = "adminAuth"
	// PolicySubscribeRefused counts subscribeRepos upgrades refused by
	// admission, keyed by IP: within it a refusal is recorded (consumer
	// health, the summary log); past it the refusal is only answered, so
	// a flood of refusals costs a fixed amount. It is apart from the
	// global limit so that a flood on the firehose does not lock the same
	// address out of the rest of the API.
	PolicySubscribeRefused = "subscribeRefused"
	// PolicyResolveHandle is keyed by IP: resolving a handle not hosted
	// here makes the server do DNS and HTTPS requests.
	PolicyResolveHandle = "resolveHandle"
	// PolicyCreateAccount is keyed by IP.
	PolicyCreateAccount = "createAccount"
	// PolicyUploadBlob is keyed by DID.
	PolicyUploadBlob = "uploadBlob"
	// PolicyUpdateHandle is keyed by DID.
	PolicyUpdateHandle = "updateHandle"
	// PolicyDeleteAccount is keyed by IP.
	PolicyDeleteAccount = "deleteAccount"
	// PolicyResetPassword is keyed by IP.
	PolicyResetPassword = "resetPassword"
	// PolicyRequestPasswordReset is keyed by IP: each call may mail a code.
	PolicyRequestPasswordReset = "requestPasswordReset"
	// PolicyRequestEmailConfirmation is keyed by DID.
	PolicyRequestEmailConfirmation = "requestEmailConfirmation"
	// PolicyRequestEmailUpdate is keyed by DID.
	PolicyRequestEmailUpdate = "requestEmailUpdate"
	// PolicyRequestAccountDelete is keyed by DID.
	PolicyRequestAccountDelete = "requestAccountDelete"
	// PolicyRequestPlcOperationSignature is keyed by DID. The reference
	// PDS has no limit here; every call mails a code, so it gets the
	// other mail requests' limits.
	PolicyRequestPlcOperationSignature = "requestPlcOperationSignature"
	// PolicyRepoWrite is the per-account write points (WriteCost*), keyed
	// by DID.
	PolicyRepoWrite = "repoWrite"
	// PolicyConsoleLogin is Bulwark's own: attempts at the operator
	// console's login form, keyed by IP.
	PolicyConsoleLogin = "consoleLogin"
	// PolicyOAuthPage is Bulwark's own: the OAuth sign-in, consent and
	// connected-apps pages (GET and POST), keyed by IP. A person's sign-in
	// takes a handful of requests.
	PolicyOAuthPage = "oauthPage"
	// PolicyOAuthMetadata is Bulwark's own: the OAuth metadata documents,
	// the pages' stylesheet and the CORS preflights of the OAuth
	// endpoints, keyed by IP.
	PolicyOAuthMetadata = "oauthMetadata"
	// PolicyOAuthPAR is Bulwark's own: pushed authorization requests,
	// keyed by IP. Each may make the server fetch a client's metadata and
	// stores a request.
	PolicyOAuthPAR = "oauthPAR"
	// PolicyOAuthToken is Bulwark's own: the OAuth token and revocation
	// endpoints, keyed by IP. An app's server refreshes its users' tokens
	// from one address, so it is looser than PAR.
	PolicyOAuthToken = "oauthToken"
	// PolicyOAuthClientPAR is Bulwark's own: pushed authorization requests
	// per OAuth client (client_id), from all addresses together.
	PolicyOAuthClientPAR = "oauthClientPAR"
	// PolicyOAuthClientToken is Bulwark's own: token and revocation
	// requests per OAuth client (client_id), from all addresses together.
	PolicyOAuthClientToken = "oauthClientToken"
	// PolicyImportRepo is Bulwark's own: repository imports started,
	// keyed by DID. A migration imports once; a few retries fit.
	PolicyImportRepo = "importRepo"
	// PolicyPreflight is Bulwark's own: CORS preflight requests (OPTIONS),
	// keyed by IP. Browsers send one before many cross-origin requests
	// (per URL, so per query string), and they are answered before any
	// route, so they are apart from the global limit rather than halving
	// a browser client's share of it.
	PolicyPreflight = "preflight"
	// PolicyMailRecipient is Bulwark's own: mail sent to one address,
	// keyed by the normalised address (email.RecipientKey), whichever
	// account or flow asks for it, so that sign-ups and code requests
	// cannot flood a third party's mailbox.
	PolicyMailRecipient = "mailRecipient"
)

// DefaultPolicies returns, by limiter name, the limits the reference PDS
// (bluesky-social/atproto) applies when its rate limiting is on, and
// Bulwark's own: loginAddress, adminAuth, resolveHandle, subscribeRefused,
// consoleLogin, importRepo, mailRecipient, preflight and the OAuth
// endpoints' (oauth*).
// subscribeRepos is not here: the reference PDS does not limit it, and
// firehose.Admission has its own per-client bucket.
func DefaultPolicies() map[string][]Rule {
	const fiveMin = 5 * time.Minute
	// An account's requests for a mailed code.
	mailRequest := func() []Rule {
		return []Rule{{Name: "hour", Limit: 5, Window: time.Hour}, {Name: "day", Limit: 15, Window: Day}}
	}
	return map[string][]Rule{
		PolicyGlobal:           {{Name: "5m", Limit: 3000, Window: fiveMin}},
		PolicyGetRepo:          {{Name: "5m", Limit: 6000, Window: fiveMin}},
		PolicyCreateSession:    {{Name: "5m", Limit: 30, Window: fiveMin}, {Name: "day", Limit: 300, Window: Day}},
		PolicyLoginAddress:     {{Name: "5m", Limit: 30, Window: fiveMin}, {Name: "day", Limit: 300, Window: Day}},
		PolicyAdminAuth:        {{Name: "5m", Limit: 10, Window: fiveMin}, {Name: "day", Limit: 100, Window: Day}},
		PolicyResolveHandle:    {{Name: "5m", Limit: 100, Window: fiveMin}},
		PolicySubscribeRefused: {{Name: "5m", Limit: 600, Window: fiveMin}},
		PolicyCreateAccount:    {{Name: "5m", Limit: 100, Window: fiveMin}},
		PolicyUploadBlob:       {{Name: "day", Limit: 1000, Window: Day}},
		PolicyUpdateHandle:     {{Name: "5m", Limit: 10, Window: fiveMin}, {Name: "day", Limit: 50, Window: Day}},
		PolicyDeleteAccount:    {{Name: "5m", Limit: 50, Window: fiveMin}},
		PolicyResetPassword:    {{Name: "5m", Limit: 50, Window: fiveMin}},
		PolicyRepoWrite:        {{Name: "hour", Limit: 5000, Window: time.Hour}, {Name: "day", Limit: 35000, Window: Day}},
		PolicyConsoleLogin:     {{Name: "5m", Limit: 10, Window: fiveMin}, {Name: "day", Limit: 100, Window: Day}},
		PolicyPreflight:        {{Name: "5m", Limit: 3000, Window: fiveMin}},
		PolicyImportRepo:       {{Name: "hour", Limit: 10, Window: time.Hour}, {Name: "day", Limit: 20, Window: Day}},
		// Three mails at once (a code, a resend, a reset), then one every
		// 100 s; ten an hour and twenty-five a day in all.
		PolicyMailRecipient: {{Name: "5m", Limit: 5, Window: fiveMin}, {Name: "hour", Limit: 15, Window: time.Hour}, {Name: "day", Limit: 40, Window: Day}},

		PolicyOAuthPage:        {{Name: "5m", Limit: 200, Window: fiveMin}},
		PolicyOAuthMetadata:    {{Name: "5m", Limit: 1000, Window: fiveMin}},
		PolicyOAuthPAR:         {{Name: "5m", Limit: 100, Window: fiveMin}},
		PolicyOAuthToken:       {{Name: "5m", Limit: 1500, Window: fiveMin}},
		PolicyOAuthClientPAR:   {{Name: "5m", Limit: 500, Window: fiveMin}},
		PolicyOAuthClientToken: {{Name: "5m", Limit: 3000, Window: fiveMin}},

		PolicyRequestPasswordReset:         {{Name: "hour", Limit: 15, Window: time.Hour}, {Name: "day", Limit: 50, Window: Day}},
		PolicyRequestEmailConfirmation:     mailRequest(),
		PolicyRequestEmailUpdate:           mailRequest(),
		PolicyRequestAccountDelete:         mailRequest(),
		PolicyRequestPlcOperationSignature: mailRequest(),
	}
}

// ParseRules reads rules from configuration: comma-separated
// "limit/window" items, the window a Go duration or a number of days
// ("3000/5m", "30/5m,300/1d"). Each rule is named by its window as written.
// "" and "off" mean no rules (the limiter allows everything).
func ParseRules(s string) ([]Rule, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "off" {
		return nil, nil
	}
	var rules []Rule
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		limitStr, windowStr, ok := strings.Cut(item, "/")
		if !ok {
			return nil, fmt.Errorf("%w %q: want limit/window, like 3000/5m", ErrBadRule, item)
		}
		limit, err := strconv.Atoi(strings.TrimSpace(limitStr))
		if err != nil || limit <= 0 {
			return nil, fmt.Errorf("%w %q: limit must be a positive integer", ErrBadRule, item)
		}
		windowStr = strings.TrimSpace(windowStr)
		window, err := parseWindow(windowStr)
		if err != nil || window <= 0 {
			return nil, fmt.Errorf("%w %q: window must be a positive duration like 5m, 1h or 1d", ErrBadRule, item)
		}
		rules = append(rules, Rule{Name: windowStr, Limit: limit, Window: window})
	}
	return rules, nil
}

func parseWindow(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, err
		}
		return time.Duration(n) * Day, nil
	}
	return time.ParseDuration(s)
}

// Set is the limiters of a server, by policy name.
type Set struct {
	byName map[string]*Limiter
	names  []string
}

// NewSet builds one Limiter per policy (DefaultPolicies, overridden from
// configuration), each tracking at most maxKeys keys (0 = DefaultMaxKeys).
// A policy with no rules gets no limiter: Get returns nil, which allows
// everything.
func NewSet(policies map[string][]Rule, maxKeys int) (*Set, error) {
	s := &Set{byName: map[string]*Limiter{}}
	for name, rules := range policies {
		if len(rules) == 0 {
			continue
		}
		l, err := New(Config{Name: name, Rules: rules, MaxKeys: maxKeys})
		if err != nil {
			return nil, err
		}
		s.byName[name] = l
		s.names = append(s.names, name)
	}
	slices.Sort(s.names)
	return s, nil
}

// Get returns the named limiter, or nil (allow everything) if that policy
// is off. A nil Set returns nil.
func (s *Set) Get(name string) *Limiter {
	if s == nil {
		return nil
	}
	return s.byName[name]
}

// All returns the limiters in name order, for metrics and pruning.
func (s *Set) All() []*Limiter {
	if s == nil {
		return nil
	}
	out := make([]*Limiter, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, s.byName[n])
	}
	return out
}

// PruneInterval is how often Set.Run forgets idle keys.
const PruneInterval = time.Minute

// Run prunes every limiter of the set each PruneInterval until ctx ends,
// so that limiters that went quiet give their memory back (busy ones
// already prune as they go).
func (s *Set) Run(ctx context.Context) {
	t := time.NewTicker(PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, l := range s.All() {
				l.Prune()
			}
		}
	}
}
