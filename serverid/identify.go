package serverid

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// IdentifyPath is where a server answers who it is. Anyone may ask: the
// answer proves the server holds the key of its runtime file and tells
// nothing else.
const IdentifyPath = "/xrpc/io.github.bulwark-pds.server.identify"

// proofPurpose is mixed into every proof, so that the proof key signs
// nothing else.
const proofPurpose = "bulwark server identity v1"

// Bounds of what a client may send.
const (
	minNonce = 16
	maxNonce = 128
	maxURL   = 512
)

// Identity is the answer at IdentifyPath.
type Identity struct {
	DID      string `json:"did"`
	Instance string `json:"instance"`
	Proof    string `json:"proof"`
}

// Proof is the hex HMAC-SHA256, under the runtime key, of the purpose,
// the instance id, the canonical URL the client reached the server at and
// the client's nonce.
func (r *Runtime) Proof(canonicalURL, nonce string) (string, error) {
	key, err := hex.DecodeString(r.Key)
	if err != nil {
		return "", fmt.Errorf("runtime key: %w", err)
	}
	m := hmac.New(sha256.New, key)
	for _, part := range []string{proofPurpose, r.Instance, canonicalURL, nonce} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil)), nil
}

// CanonicalURL is the form of a server base URL that proofs cover:
// scheme and host lower case, no trailing slash; a path, query, fragment
// or user info is refused.
func CanonicalURL(raw string) (string, error) {
	if len(raw) > maxURL {
		return "", errors.New("URL too long")
	}
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q is not a server base URL (http(s)://host[:port])", raw)
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host), nil
}

// Addresses are the URLs a server answers for: its public URL, and plain
// http to its listen address.
type Addresses struct {
	// Listen is the address the server is bound to (host:port).
	Listen string
	// PublicURL is the base URL clients use.
	PublicURL string
}

// Own reports whether the canonical URL u reaches this server: it is the
// public URL, or http to the listen port at the listen host (any IP
// address or localhost for a wildcard listen address, localhost for a
// loopback one). A program on another port, or on another address of a
// server bound to one, is not this server.
func (a Addresses) Own(u string) bool {
	if pub, err := CanonicalURL(a.PublicURL); err == nil && pub == u {
		return true
	}
	rest, ok := strings.CutPrefix(u, "http://")
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return false
	}
	lhost, lport, err := net.SplitHostPort(a.Listen)
	if err != nil || port != lport {
		return false
	}
	ip, ipErr := netip.ParseAddr(host)
	lip, lipErr := netip.ParseAddr(lhost)
	switch {
	case lhost == "" || (lipErr == nil && lip.IsUnspecified()):
		return ipErr == nil || host == "localhost"
	case lipErr == nil && ipErr == nil:
		return ip.Unmap() == lip.Unmap()
	case lipErr == nil && lip.IsLoopback():
		return host == "localhost"
	default:
		return strings.EqualFold(host, lhost)
	}
}

// Handler answers IdentifyPath: GET with url (the base URL the client
// used) and nonce (16 to 128 letters and digits). allow is asked first,
// with the request, and refuses by writing its own answer.
func Handler(rt *Runtime, addrs Addresses, allow func(http.ResponseWriter, *http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, "InvalidRequest", "use GET")
			return
		}
		if !allow(w, r) {
			return
		}
		q := r.URL.Query()
		nonce := q.Get("nonce")
		if !validNonce(nonce) {
			writeError(w, http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("nonce: %d to %d letters and digits", minNonce, maxNonce))
			return
		}
		u, err := CanonicalURL(q.Get("url"))
		if err != nil {
			writeError(w, http.StatusBadRequest, "InvalidRequest", "url: not a server base URL")
			return
		}
		if !addrs.Own(u) {
			writeError(w, http.StatusBadRequest, "NotThisServer", "url is not an address of this server")
			return
		}
		proof, err := rt.Proof(u, nonce)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "InternalServerError", "cannot prove")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(Identity{DID: rt.DID, Instance: rt.Instance, Proof: proof})
	})
}

func validNonce(s string) bool {
	if len(s) < minNonce || len(s) > maxNonce {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

func writeError(w http.ResponseWriter, status int, name, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": name, "message": msg})
}

// ErrNotConfirmed means the server at a URL did not prove it is the
// server of the runtime file.
var ErrNotConfirmed = errors.New("not confirmed as the server of this data directory")

// Confirm asks the server at base who it is and checks the answer against
// rt: the same DID and instance, and a proof for base and a fresh nonce.
// It sends no credentials. An error wraps ErrNotConfirmed when the server
// answered but did not prove it.
func Confirm(ctx context.Context, client *http.Client, base string, rt *Runtime) error {
	u, err := CanonicalURL(base)
	if err != nil {
		return err
	}
	nonce := hex.EncodeToString(randomBytes(24))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		u+IdentifyPath+"?"+url.Values{"url": {u}, "nonce": {nonce}}.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var id Identity
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &id) != nil {
		var xe struct{ Error, Message string }
		if json.Unmarshal(body, &xe) == nil && xe.Error != "" {
			return fmt.Errorf("%w: it answered %s: %s (HTTP %d)", ErrNotConfirmed, xe.Error, xe.Message, resp.StatusCode)
		}
		return fmt.Errorf("%w: it answered HTTP %d, not a Bulwark identity", ErrNotConfirmed, resp.StatusCode)
	}
	want, err := rt.Proof(u, nonce)
	if err != nil {
		return err
	}
	switch {
	case id.Instance != rt.Instance || id.DID != rt.DID:
		return fmt.Errorf("%w: it is %s (instance %s), the data directory's server is %s (instance %s)",
			ErrNotConfirmed, id.DID, id.Instance, rt.DID, rt.Instance)
	case !hmac.Equal([]byte(id.Proof), []byte(want)):
		return fmt.Errorf("%w: its proof does not match the data directory's key", ErrNotConfirmed)
	}
	return nil
}
