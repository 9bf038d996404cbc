package oauth

import (
	"bytes"
	"embed"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed templates/style.css
var styleCSS []byte

// pages holds one parsed template set per page.
type pages struct {
	sets map[string]*template.Template
}

func newPages() (*pages, error) {
	p := &pages{sets: map[string]*template.Template{}}
	for _, name := range []string{"signin", "choose", "consent", "error", "account"} {
		t, err := template.New(name).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		p.sets[name] = t
	}
	return p, nil
}

// pageData is everything a page template may show.
type pageData struct {
	Title      string
	ServerName string
	Error      string
	Notice     string
	CSRF       string
	FormAction string
	// The authorization request the page belongs to.
	RequestURI string
	ClientID   string
	ClientName string
	// Sign-in: the identifier as entered, and whether to ask for the
	// code mailed to the account.
	Identifier string
	AskCode    bool
	// Choosing, consenting, account page.
	Accounts    []Account
	Account     Account
	Permissions []string
	Sets        []permissionGroup
	// Shown names the permissions the consent page shows (grantsDigest).
	Shown  string
	Switch bool
	Grants []grantView
	// Error page.
	Message string
	Back    string
}

type grantView struct {
	ID          string
	ClientID    string
	Created     string
	LastUsed    string
	Permissions []string
	Sets        []permissionGroup
}

const basePolicy = "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"

// render writes a page with the headers every page gets: a strict CSP
// (no scripts at all), no framing, no caching, no referrer. extraFormAction
// is a CSP source the page's forms may end up at (the client's redirect
// origin, since approving redirects there after the POST).
func (s *Server) render(w http.ResponseWriter, status int, page string, d *pageData, extraFormAction string) {
	d.ServerName = s.cfg.ServerName
	if d.FormAction == "" {
		d.FormAction = PathAuthorize
	}
	var buf bytes.Buffer
	if err := s.pages.sets[page].ExecuteTemplate(&buf, "layout", d); err != nil {
		s.log.Error("page template failed", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	policy := basePolicy
	if extraFormAction != "" {
		policy += " " + extraFormAction
	}
	h := w.Header()
	h.Set("Content-Security-Policy", policy)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorPage shows a problem in words a person understands.
func (s *Server) errorPage(w http.ResponseWriter, status int, title, message string) {
	s.render(w, status, "error", &pageData{Title: title, Message: message}, "")
}

func (s *Server) handleStyle(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(styleCSS)
}

// cspSourceSafe matches what may go into a CSP source expression.
var cspSourceSafe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*:(//[A-Za-z0-9.\-\[\]:*]+)?$`)

// redirectSource is the CSP form-action source for a redirect URI: its
// origin (any port for loopback, whose port may vary), or its scheme for
// a native app's private-use scheme.
func redirectSource(redirect string) string {
	u, err := url.Parse(redirect)
	if err != nil {
		return ""
	}
	var src string
	switch {
	case u.Scheme == "http" && isLoopbackIP(u.Hostname()):
		host := u.Hostname()
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		src = "http://" + host + ":*"
	case u.Scheme == "https" || u.Scheme == "http":
		src = u.Scheme + "://" + u.Host
	default:
		src = u.Scheme + ":"
	}
	if !cspSourceSafe.MatchString(src) {
		return ""
	}
	return src
}

func formatTime(t time.Time) string { return t.UTC().Format("2 Jan 2006 15:04 UTC") }
