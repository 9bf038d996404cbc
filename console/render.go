package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages holds each page's template: the layout with the page's blocks.
type pages struct {
	byName map[string]*template.Template
}

var funcs = template.FuncMap{
	"bytes":    bytesOf,
	"time":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"join":     strings.Join,
	"prefix":   func() string { return Prefix },
	"deref":    func(p *int64) int64 { return *p },
	"truncate": truncate,
	"seconds":  func(s int64) string { return (time.Duration(s) * time.Second).String() },
}

func loadPages() (*pages, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/partials.html")
	if err != nil {
		return nil, fmt.Errorf("console layout: %w", err)
	}
	p := &pages{byName: map[string]*template.Template{}}
	for _, n := range names {
		name := path.Base(n)
		if name == "layout.html" || name == "partials.html" {
			continue
		}
		t, err := base.Clone()
		if err == nil {
			t, err = t.ParseFS(templateFS, n)
		}
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", name, err)
		}
		p.byName[strings.TrimSuffix(name, ".html")] = t
	}
	return p, nil
}

// view is what every page template gets.
type view struct {
	Title string
	// Nav names the section the page belongs to (overview, firehose,
	// accounts, invites, audit); empty outside a session.
	Nav  string
	CSRF string
	// Refresh, when positive, reloads the page every so many seconds.
	Refresh int
	Data    any
}

// render writes page name with status. The page is rendered to a buffer
// first, so a template error is a clean 500, not half a page.
func (c *Console) render(w http.ResponseWriter, status int, name string, v view) {
	t := c.pages.byName[name]
	var buf bytes.Buffer
	if t == nil {
		c.log.Error("console page missing", "page", name)
		http.Error(w, "console page missing", http.StatusInternalServerError)
		return
	}
	if err := t.ExecuteTemplate(&buf, "layout.html", v); err != nil {
		c.log.Error("console page failed to render", "page", name, "err", err)
		http.Error(w, "console page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// show renders a page for the logged-in operator.
func (c *Console) show(w http.ResponseWriter, s session, nav, title, name string, data any) error {
	c.render(w, http.StatusOK, name, view{Title: title, Nav: nav, CSRF: c.csrf(s), Data: data})
	return nil
}

// fail answers an error page with status and a message for the operator.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	v := view{Title: http.StatusText(status), Data: msg}
	if s, err := c.sessionOf(r); err == nil {
		v.Nav, v.CSRF = "error", c.csrf(s)
	}
	c.render(w, status, "error", v)
}

// handleStatic serves the embedded stylesheet.
func (c *Console) handleStatic(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if name != "console.css" {
		c.fail(w, r, http.StatusNotFound, "There is no such file.")
		return
	}
	data, err := staticFS.ReadFile("static/" + name)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, "There is no such file.")
		return
	}
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=3600")
	_, _ = w.Write(data)
}

// bytesOf is the template's size function: sizes come as int (event
// sizes) and int64 (the budget), and a template does not convert them.
func bytesOf(v any) (string, error) {
	switch n := v.(type) {
	case int:
		return humanBytes(int64(n)), nil
	case int64:
		return humanBytes(n), nil
	case uint64:
		return humanBytes(int64(min(n, math.MaxInt64))), nil
	}
	return "", fmt.Errorf("bytes: %T is not a size", v)
}

// humanBytes writes a size for people: 5.1 MB, 812 B.
func humanBytes(n int64) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.0f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

// truncate cuts s to n bytes for a table cell.
func truncate(n int, s string) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && (s[n]&0xc0) == 0x80 {
		n--
	}
	return s[:n] + "…"
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
