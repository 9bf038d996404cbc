package proxy

import (
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// HeaderName is the request header that names the service to proxy to.
const HeaderName = "Atproto-Proxy"

// Header limits. A DID is at most 2048 characters (atproto DID syntax); a
// service id is a short DID-document fragment such as bsky_appview.
const (
	// MaxServiceIDLength bounds the service id after the '#'.
	MaxServiceIDLength = 128
	// MaxHeaderLength bounds the whole atproto-proxy value.
	MaxHeaderLength = 2048 + 1 + MaxServiceIDLength
)

// ParseHeader parses an atproto-proxy header value, "<did>#<service id>",
// e.g. "did:web:api.bsky.app#bsky_appview". It is strict: exactly one '#',
// a valid DID before it, a non-empty id after it made of ASCII letters,
// digits and "-._~:", no spaces, at most MaxHeaderLength bytes. Errors wrap
// ErrBadHeader.
func ParseHeader(v string) (did syntax.DID, serviceID string, err error) {
	if len(v) > MaxHeaderLength {
		return "", "", newError(ErrBadHeader, nil, "atproto-proxy header is longer than %d bytes", MaxHeaderLength)
	}
	if strings.ContainsAny(v, " \t\r\n") {
		return "", "", newError(ErrBadHeader, nil, "atproto-proxy header cannot contain spaces")
	}
	raw, id, ok := strings.Cut(v, "#")
	switch {
	case !ok || id == "":
		return "", "", newError(ErrBadHeader, nil, "no service id specified in atproto-proxy header")
	case raw == "":
		return "", "", newError(ErrBadHeader, nil, "no DID specified in atproto-proxy header")
	case strings.Contains(id, "#"):
		return "", "", newError(ErrBadHeader, nil, "atproto-proxy header must contain exactly one '#'")
	case len(id) > MaxServiceIDLength:
		return "", "", newError(ErrBadHeader, nil, "atproto-proxy service id is longer than %d bytes", MaxServiceIDLength)
	case !validServiceID(id):
		return "", "", newError(ErrBadHeader, nil, "atproto-proxy service id may only contain letters, digits and -._~:")
	}
	did, perr := syntax.ParseDID(raw)
	if perr != nil {
		return "", "", newError(ErrBadHeader, perr, "atproto-proxy header does not start with a valid DID")
	}
	return did, id, nil
}

func validServiceID(id string) bool {
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '.' || c == '_' || c == '~' || c == ':':
		default:
			return false
		}
	}
	return true
}
