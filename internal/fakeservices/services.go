package fakeservices

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/did-method-plc/go-didplc"
	"github.com/golang-jwt/jwt/v5"
)

// Names of the services, as Call.Service reports them.
const (
	AppViewName = "appview"
	ChatName    = "chat"
	FeedGenName = "feedgen"
)

// Config says where the services register and listen.
type Config struct {
	// PLCURL is the PLC directory the services register their DIDs in and
	// resolve callers' keys from. Required.
	PLCURL string
	// Host is the address the services listen on (default 127.0.0.1),
	// each on a port of its own.
	Host string
	// Logger logs refused tokens (default: discard).
	Logger *slog.Logger
}

// Service is one running fake.
type Service struct {
	// Name is AppViewName, ChatName or FeedGenName.
	Name string
	// DID is the service's did:plc: the audience its tokens must carry.
	DID syntax.DID
	// URL is its base URL (http://host:port), the endpoint in its DID
	// document.
	URL string
	// ServiceID is the id of its main DID-document service entry, without
	// '#': bsky_appview, bsky_chat, bsky_fg.
	ServiceID string
}

// Call is one request a service received.
type Call struct {
	// Service is the name of the service that got it.
	Service string `json:"service"`
	// Method is the XRPC method called.
	Method string `json:"method"`
	// Iss, Aud and Lxm are the claims of the request's service-auth token
	// (empty without one).
	Iss string `json:"iss,omitempty"`
	Aud string `json:"aud,omitempty"`
	Lxm string `json:"lxm,omitempty"`
	// Verified is true when the token passed ServiceAuthValidator for
	// this service and method.
	Verified bool `json:"verified"`
	// Error says why the token was refused ("" when it was not, or when
	// there was none).
	Error string `json:"error,omitempty"`
}

// Services are the three fakes. Close stops them.
type Services struct {
	AppView, Chat, FeedGen Service
	// FeedURI is the feed generator record the app view knows:
	// at://<feed generator DID>/app.bsky.feed.generator/fake.
	FeedURI string

	dir     identity.Directory
	log     *slog.Logger
	servers []*http.Server

	mu    sync.Mutex
	calls []Call
	revs  map[syntax.DID]string
	prefs map[syntax.DID]json.RawMessage
}

// Start registers the three services in cfg.PLCURL and serves them until
// Close.
func Start(ctx context.Context, cfg Config) (*Services, error) {
	if cfg.PLCURL == "" {
		return nil, errors.New("fakeservices: PLCURL is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	base := &identity.BaseDirectory{PLCURL: strings.TrimRight(cfg.PLCURL, "/"), SkipHandleVerification: true, HTTPClient: http.Client{Timeout: 10 * time.Second}}
	s := &Services{
		dir:   identity.NewCacheDirectory(base, 1000, time.Minute, time.Second, time.Second),
		log:   cfg.Logger,
		revs:  map[syntax.DID]string{},
		prefs: map[syntax.DID]json.RawMessage{},
	}
	specs := []struct {
		svc      *Service
		name     string
		entries  map[string]string // service id → type
		mainID   string
		handlers map[string]handler
	}{
		{&s.AppView, AppViewName, map[string]string{"bsky_appview": "BskyAppView", "bsky_notif": "BskyNotificationService"}, "bsky_appview", s.appViewHandlers()},
		{&s.Chat, ChatName, map[string]string{"bsky_chat": "BskyChatService"}, "bsky_chat", s.chatHandlers()},
		{&s.FeedGen, FeedGenName, map[string]string{"bsky_fg": "BskyFeedGenerator"}, "bsky_fg", s.feedGenHandlers()},
	}
	for _, sp := range specs {
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, "0"))
		if err != nil {
			s.Close()
			return nil, err
		}
		url := "http://" + ln.Addr().String()
		entries := map[string]didplc.OpService{}
		for id, typ := range sp.entries {
			entries[id] = didplc.OpService{Type: typ, Endpoint: url}
		}
		did, _, err := Register(ctx, cfg.PLCURL, entries)
		if err != nil {
			ln.Close()
			s.Close()
			return nil, err
		}
		*sp.svc = Service{Name: sp.name, DID: did, URL: url, ServiceID: sp.mainID}
		srv := &http.Server{Handler: s.mux(*sp.svc, sp.handlers), ReadHeaderTimeout: 10 * time.Second}
		s.servers = append(s.servers, srv)
		go func() { _ = srv.Serve(ln) }()
	}
	s.FeedURI = "at://" + s.FeedGen.DID.String() + "/app.bsky.feed.generator/fake"
	return s, nil
}

// Close stops the services.
func (s *Services) Close() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
}

// Calls returns what the services received, in order.
func (s *Services) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// SetRepoRev makes the app view answer did's requests with
// atproto-repo-rev: rev, the revision of did's repository it claims to
// have indexed ("" sends none).
func (s *Services) SetRepoRev(did syntax.DID, rev string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revs[did] = rev
}

func (s *Services) repoRev(did syntax.DID) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.revs[did]
}

func (s *Services) record(c Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

// Register creates a did:plc whose document lists services (by id,
// without '#') and a fresh #atproto key, submits it to the PLC directory
// at plcURL, and returns the DID and the signing key.
func Register(ctx context.Context, plcURL string, services map[string]didplc.OpService) (syntax.DID, atcrypto.PrivateKey, error) {
	rotation, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return "", nil, err
	}
	signing, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return "", nil, err
	}
	rotPub, err := rotation.PublicKey()
	if err != nil {
		return "", nil, err
	}
	sigPub, err := signing.PublicKey()
	if err != nil {
		return "", nil, err
	}
	op := &didplc.RegularOp{
		Type:                "plc_operation",
		RotationKeys:        []string{rotPub.DIDKey()},
		VerificationMethods: map[string]string{"atproto": sigPub.DIDKey()},
		AlsoKnownAs:         []string{},
		Services:            services,
	}
	if err := op.Sign(rotation); err != nil {
		return "", nil, err
	}
	raw, err := op.DID()
	if err != nil {
		return "", nil, err
	}
	c := didplc.Client{DirectoryURL: strings.TrimRight(plcURL, "/")}
	if err := c.Submit(ctx, raw, op); err != nil {
		return "", nil, fmt.Errorf("fakeservices: registering %s: %w", raw, err)
	}
	return syntax.DID(raw), signing, nil
}

// verify checks the request's service-auth token for audience and method
// lxm, records the call, and returns the verified caller ("" when the
// token is missing or refused).
func (s *Services) verify(r *http.Request, svc Service, method, audience string, lxm syntax.NSID) syntax.DID {
	c := Call{Service: svc.Name, Method: method}
	defer func() { s.record(c) }()
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	var claims struct {
		jwt.RegisteredClaims
		Lxm string `json:"lxm"`
	}
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil {
		c.Error = "unparsable token: " + err.Error()
		return ""
	}
	c.Iss, c.Lxm = claims.Issuer, claims.Lxm
	if len(claims.Audience) > 0 {
		c.Aud = claims.Audience[0]
	}
	v := auth.ServiceAuthValidator{Audience: audience, Dir: s.dir}
	iss, err := v.Validate(r.Context(), token, &lxm)
	if err != nil {
		c.Error = err.Error()
		s.log.Warn("service token refused", "service", svc.Name, "method", method, "error", err)
		return ""
	}
	c.Verified = true
	return iss
}
