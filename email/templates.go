package email

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	texttemplate "text/template"
	"time"
)

// Kind is what a mail is for; each has a subject, a plain-text and an HTML
// template.
type Kind string

// Kinds. Each token kind carries the code of the Purpose of the same name.
const (
	KindConfirmEmail  Kind = Kind(PurposeConfirmEmail)
	KindUpdateEmail   Kind = Kind(PurposeUpdateEmail)
	KindResetPassword Kind = Kind(PurposeResetPassword)
	KindDeleteAccount Kind = Kind(PurposeDeleteAccount)
	KindPLCOperation  Kind = Kind(PurposePLCOperation)
	KindSignIn        Kind = Kind(PurposeSignIn)
	// KindAdminMessage is com.atproto.admin.sendEmail: a subject and
	// content written by the administrator.
	KindAdminMessage Kind = "admin_message"
)

// Kinds lists every Kind.
var Kinds = []Kind{KindConfirmEmail, KindUpdateEmail, KindResetPassword, KindDeleteAccount, KindPLCOperation, KindSignIn, KindAdminMessage}

// Valid reports whether k is one of the Kind constants.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if k == x {
			return true
		}
	}
	return false
}

// Purpose is the purpose of the code a kind of mail carries, or "" for a
// kind without one.
func (k Kind) Purpose() Purpose {
	if p := Purpose(k); p.Valid() {
		return p
	}
	return ""
}

// Template file names: KIND.subject.txt, KIND.txt and KIND.html, and the
// page the HTML templates are drawn in, layout.html.
const (
	subjectSuffix = ".subject.txt"
	textSuffix    = ".txt"
	htmlSuffix    = ".html"
	layoutFile    = "layout.html"
	// maxTemplateFile bounds an operator's template file.
	maxTemplateFile = 256 << 10
	// maxSubject bounds a rendered subject (RFC 5322 allows 998 bytes per
	// header line; mail clients show far fewer).
	maxSubject = 500
)

// TemplateData is what templates see.
type TemplateData struct {
	// Handle is the account's handle, without "@" (may be empty).
	Handle string
	// Token is the code, "XXXXX-XXXXX" (token kinds).
	Token string
	// Hostname is the server's public host name.
	Hostname string
	// ExpiresAt is when the code expires (token kinds).
	ExpiresAt time.Time
	// ExpiresIn is the code's remaining lifetime in words, "15 minutes".
	ExpiresIn string
	// Subject is, in the subject template of an admin message, the
	// administrator's subject (may be empty); in body templates, the
	// rendered subject.
	Subject string
	// Content is an admin message's text.
	Content string
}

//go:embed templates/*
var defaultTemplates embed.FS

// kindTemplates is one kind's parsed templates.
type kindTemplates struct {
	subject *texttemplate.Template
	text    *texttemplate.Template
	html    *htmltemplate.Template
}

// templateSet holds every kind's templates.
type templateSet map[Kind]*kindTemplates

// rendered is a mail ready to send.
type rendered struct {
	Subject, Text, HTML string
}

// loadTemplates parses the embedded defaults, each replaced by the file of
// the same name in dir when there is one, and renders every template with
// sample data so that a broken override stops the server at start-up
// instead of failing the first mail of its kind.
func loadTemplates(dir string) (templateSet, error) {
	if dir != "" {
		st, err := os.Stat(dir)
		if err != nil {
			return nil, fmt.Errorf("%w: template directory: %w", ErrInvalidConfig, err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("%w: template directory %s is not a directory", ErrInvalidConfig, dir)
		}
	}
	set := templateSet{}
	for _, k := range Kinds {
		kt := &kindTemplates{}
		var err error
		if kt.subject, err = parseText(dir, string(k)+subjectSuffix); err != nil {
			return nil, err
		}
		if kt.text, err = parseText(dir, string(k)+textSuffix); err != nil {
			return nil, err
		}
		if kt.html, err = parseHTML(dir, string(k)+htmlSuffix); err != nil {
			return nil, err
		}
		set[k] = kt
		if _, err := set.render(k, sampleData(k)); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// source returns the override in dir, else the embedded default.
func source(dir, name string) (string, string, error) {
	if dir != "" {
		path := filepath.Join(dir, name)
		f, err := os.Open(path)
		switch {
		case err == nil:
			defer f.Close()
			var b bytes.Buffer
			n, err := b.ReadFrom(io.LimitReader(f, maxTemplateFile+1))
			if err != nil {
				return "", "", fmt.Errorf("%w %s: %w", ErrTemplate, path, err)
			}
			if n > maxTemplateFile {
				return "", "", fmt.Errorf("%w %s: larger than %d bytes", ErrTemplate, path, maxTemplateFile)
			}
			return b.String(), path, nil
		case !errors.Is(err, fs.ErrNotExist):
			return "", "", fmt.Errorf("%w %s: %w", ErrTemplate, path, err)
		}
	}
	b, err := defaultTemplates.ReadFile("templates/" + name)
	if err != nil {
		return "", "", fmt.Errorf("%w: no default %s: %w", ErrTemplate, name, err)
	}
	return string(b), "default " + name, nil
}

func parseText(dir, name string) (*texttemplate.Template, error) {
	src, where, err := source(dir, name)
	if err != nil {
		return nil, err
	}
	t, err := texttemplate.New(name).Option("missingkey=error").Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrTemplate, where, err)
	}
	return t, nil
}

// parseHTML parses a kind's HTML template with the layout beside it. The
// built-in layout comes first, then the operator's layout.html over it,
// then the kind's file: an operator's layout replaces the page but keeps
// the parts it does not redefine ("greeting", "code"), and what the kind's
// file defines ("content", "signature") wins over the layout's blocks. A
// kind's file that is a whole page of its own simply does not call the
// layout.
func parseHTML(dir, name string) (*htmltemplate.Template, error) {
	t := htmltemplate.New(name).Option("missingkey=error")
	for _, f := range []struct{ dir, file string }{{"", layoutFile}, {dir, layoutFile}, {dir, name}} {
		src, where, err := source(f.dir, f.file)
		if err != nil {
			return nil, err
		}
		into := t
		if f.file != name {
			into = t.New(f.file)
		}
		if _, err := into.Parse(src); err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrTemplate, where, err)
		}
	}
	return t, nil
}

// render fills in one kind's templates.
func (s templateSet) render(k Kind, d TemplateData) (*rendered, error) {
	kt, ok := s[k]
	if !ok {
		return nil, fmt.Errorf("%w: unknown kind %q", ErrTemplate, k)
	}
	var b bytes.Buffer
	if err := kt.subject.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrTemplate, kt.subject.Name(), err)
	}
	// One header line, however the template or the admin's subject broke it.
	subject := strings.Join(strings.Fields(b.String()), " ")
	if subject == "" {
		return nil, fmt.Errorf("%w %s: renders an empty subject", ErrTemplate, kt.subject.Name())
	}
	if len(subject) > maxSubject {
		subject = truncateUTF8(subject, maxSubject)
	}
	d.Subject = subject
	out := &rendered{Subject: subject}
	b.Reset()
	if err := kt.text.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrTemplate, kt.text.Name(), err)
	}
	out.Text = b.String()
	b.Reset()
	if err := kt.html.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrTemplate, kt.html.Name(), err)
	}
	out.HTML = b.String()
	return out, nil
}

// sampleData is what start-up renders each template with.
func sampleData(k Kind) TemplateData {
	d := TemplateData{Handle: "alice.example.com", Hostname: "pds.example.com"}
	if k.Purpose() != "" {
		d.Token = "ABCDE-FGHIJ"
		d.ExpiresAt = time.Date(2030, 1, 1, 0, 15, 0, 0, time.UTC)
		d.ExpiresIn = "15 minutes"
	} else {
		d.Subject = "Sample subject"
		d.Content = "Sample content."
	}
	return d
}

// expiresIn says a lifetime in words, rounded up to a minute.
func expiresIn(d time.Duration) string {
	m := int((d + time.Minute - 1) / time.Minute)
	switch {
	case m <= 1:
		return "1 minute"
	case m < 120 && m%60 != 0:
		return fmt.Sprintf("%d minutes", m)
	case m%60 == 0 && m/60 == 1:
		return "1 hour"
	default:
		return fmt.Sprintf("%d hours", (m+59)/60)
	}
}

func truncateUTF8(s string, n int) string {
	for n > 0 && n < len(s) && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n]
}
