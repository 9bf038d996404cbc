package pds

import (
	"net/http"
	"strings"
)

// Bounds on what a client sends that the server logs, stores or keys on.
// Headers may be up to MaxHeaderBytes and a path nearly as long; none of
// that may reach a log line, a table or a rate-limit key whole.
const (
	// maxUserAgent is how much of a User-Agent is logged or kept (consumer
	// health keeps the same, firehose.MaxUserAgent): enough for any
	// client's name and version.
	maxUserAgent = 256
	// maxLoggedPath is how much of a request path the access log keeps;
	// an XRPC path is "/xrpc/" and an NSID of at most 317 bytes.
	maxLoggedPath = 512
	// maxLoggedMessage is how much of an error message (which may quote
	// the client's input) the debug log keeps.
	maxLoggedMessage = 512
	// maxQuoted is how much of a client's value an error message quotes.
	maxQuoted = 128
	// maxIdentifierKey is the longest login identifier used as a
	// rate-limit key as it is; longer ones (no handle, email or DID is)
	// are keyed by their hash.
	maxIdentifierKey = 256
)

// userAgent is the request's User-Agent, cut to maxUserAgent bytes.
func userAgent(r *http.Request) string { return clip(r.UserAgent(), maxUserAgent) }

// clip cuts s to at most n bytes on a UTF-8 boundary, marking the cut
// with "…" (within the n bytes).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	return strings.ToValidUTF8(s[:n-len(mark)], "") + mark
}
