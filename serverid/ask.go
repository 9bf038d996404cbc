package serverid

import (
	"net"
	"net/http"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

// AskPath is where a TLS terminator with on-demand certificates (Caddy's
// on_demand_tls ask) asks whether a name is served here before it gets a
// certificate for it.
const AskPath = "/tls-ask"

var qHostsHandle = queries.MustGet("HostsHandle")

// AskHandler answers AskPath?domain=NAME: 200 when NAME is the server's
// host name (hostname, its port ignored) or the handle of an active
// account here (the names /.well-known/atproto-did answers for), 404 for
// any other name, 400 for what is no host name at all. Each answer costs at most one indexed read; allow is asked
// first and refuses by writing its own answer. The answer says no more
// than the name's /.well-known/atproto-did does.
func AskHandler(q db.DBTX, hostname string, allow func(http.ResponseWriter, *http.Request) bool) http.Handler {
	if h, _, err := net.SplitHostPort(hostname); err == nil {
		hostname = h
	}
	hostname = strings.ToLower(hostname)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "use GET", http.StatusMethodNotAllowed)
			return
		}
		if !allow(w, r) {
			return
		}
		domain := strings.ToLower(strings.TrimSuffix(r.URL.Query().Get("domain"), "."))
		if domain == hostname {
			w.WriteHeader(http.StatusOK)
			return
		}
		h, err := syntax.ParseHandle(domain)
		if err != nil {
			http.Error(w, "not a host name", http.StatusBadRequest)
			return
		}
		var ok bool
		if err := q.QueryRow(r.Context(), qHostsHandle, h.Normalize().String()).Scan(&ok); err != nil {
			http.Error(w, "lookup failed", http.StatusServiceUnavailable)
			return
		}
		if !ok {
			http.Error(w, "not served here", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
