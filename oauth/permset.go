package oauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Permission sets (include:<nsid>[?aud=<did>#<service>]) are lexicon
// documents of type permission-set, published by the NSID's authority and
// resolved through Config.Lexicons (lexicon resolution, verified). A set
// grants only repo and rpc permissions on resources in its own namespace
// (the NSIDs that share its group: app.example.authFull may name
// app.example.post and app.example.feed.like, never app.other.post); an
// rpc permission's audience is "*" or, with inheritAud, the include's
// aud. Anything else in a set (other resources, wildcards, fixed
// audiences, unknown fields, names outside the namespace) is ignored,
// permission by permission, as the permission spec requires.

// Bounds on permission sets.
const (
	// MaxSetDocumentBytes bounds a set's lexicon document.
	MaxSetDocumentBytes = 64 << 10
	// maxSetPermissions bounds the permissions one set may declare.
	maxSetPermissions = 64
	// maxSetItems bounds the collections or methods of one permission.
	maxSetItems = 256
	// MaxIncludes bounds the distinct permission sets one request names.
	MaxIncludes = 8
	// MaxTokenScopeLen bounds a scope with its permission sets expanded:
	// what a grant stores and the token endpoint returns.
	MaxTokenScopeLen = 32 << 10
	// Shown lengths of a set's title and detail, in characters.
	maxSetTitle  = 120
	maxSetDetail = 600
)

// errSetInvalid means a lexicon document is not a usable permission set.
var errSetInvalid = errors.New("not a usable permission set")

// permissionSet is a parsed permission-set lexicon.
type permissionSet struct {
	NSID   syntax.NSID
	Title  string
	Detail string
	perms  []setPermission
}

// setPermission is one permission of a set that this server understands.
type setPermission struct {
	resource   string // "repo" or "rpc"
	collection []string
	action     []string
	lxm        []string
	aud        string // "*", or "" with inheritAud
	inheritAud bool
}

// setFields are the fields a set's permission may have, by resource; a
// permission with any other is ignored (it might narrow what it grants in
// a way this server cannot honour).
var setFields = map[string][]string{
	"repo": {"type", "resource", "description", "collection", "action"},
	"rpc":  {"type", "resource", "description", "lxm", "aud", "inheritAud"},
}

// parsePermissionSet reads nsid's lexicon document as a permission set.
func parsePermissionSet(nsid syntax.NSID, doc []byte) (*permissionSet, error) {
	if len(doc) > MaxSetDocumentBytes {
		return nil, fmt.Errorf("%w: the document is larger than %d bytes", errSetInvalid, MaxSetDocumentBytes)
	}
	var lex struct {
		ID   string `json:"id"`
		Defs map[string]struct {
			Type        string            `json:"type"`
			Title       string            `json:"title"`
			Detail      string            `json:"detail"`
			Permissions []json.RawMessage `json:"permissions"`
		} `json:"defs"`
	}
	if err := json.Unmarshal(doc, &lex); err != nil {
		return nil, fmt.Errorf("%w: %w", errSetInvalid, err)
	}
	main, ok := lex.Defs["main"]
	switch {
	case lex.ID != nsid.String():
		return nil, fmt.Errorf("%w: the document's id is %q", errSetInvalid, lex.ID)
	case !ok || main.Type != "permission-set":
		return nil, fmt.Errorf("%w: its main definition is not a permission-set", errSetInvalid)
	case len(main.Permissions) > maxSetPermissions:
		return nil, fmt.Errorf("%w: more than %d permissions", errSetInvalid, maxSetPermissions)
	}
	ps := &permissionSet{NSID: nsid, Title: shownText(main.Title, maxSetTitle), Detail: shownText(main.Detail, maxSetDetail)}
	for _, raw := range main.Permissions {
		p, err := parseSetPermission(nsid, raw)
		if err != nil {
			return nil, err
		}
		if p != nil {
			ps.perms = append(ps.perms, *p)
		}
	}
	return ps, nil
}

// parseSetPermission reads one permission of set. It returns nil for a
// permission to ignore, and an error only for one beyond the set bounds.
func parseSetPermission(set syntax.NSID, raw json.RawMessage) (*setPermission, error) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return nil, nil
	}
	var typ, resource string
	if json.Unmarshal(fields["type"], &typ) != nil || typ != "permission" ||
		json.Unmarshal(fields["resource"], &resource) != nil {
		return nil, nil
	}
	allowed, ok := setFields[resource]
	if !ok {
		return nil, nil
	}
	for k := range fields {
		if !slices.Contains(allowed, k) {
			return nil, nil
		}
	}
	p := &setPermission{resource: resource}
	if !optional(fields, "collection", &p.collection) || !optional(fields, "action", &p.action) ||
		!optional(fields, "lxm", &p.lxm) || !optional(fields, "aud", &p.aud) || !optional(fields, "inheritAud", &p.inheritAud) {
		return nil, nil
	}
	if len(p.collection) > maxSetItems || len(p.lxm) > maxSetItems || len(p.action) > 3 {
		return nil, fmt.Errorf("%w: a permission lists more than %d items", errSetInvalid, maxSetItems)
	}
	names := p.collection
	if resource == "rpc" {
		names = p.lxm
		// An audience is "*" or inherited from the include, never fixed
		// by the set, and never both.
		if p.aud != "" && (p.aud != "*" || p.inheritAud) || p.aud == "" && !p.inheritAud {
			return nil, nil
		}
	}
	for _, a := range p.action {
		if a != ActionCreate && a != ActionUpdate && a != ActionDelete {
			return nil, nil
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	for _, n := range names {
		if _, err := syntax.ParseNSID(n); err != nil || !inNamespace(set, n) {
			return nil, nil
		}
	}
	return p, nil
}

// optional decodes fields[name] into v when present, reporting whether it
// was absent or of the right type.
func optional(fields map[string]json.RawMessage, name string, v any) bool {
	raw, ok := fields[name]
	return !ok || json.Unmarshal(raw, v) == nil
}

// inNamespace reports whether name is under set's group: the set's NSID
// without its last segment, or a child of it (the authority part
// compared without case, as domain names are).
func inNamespace(set syntax.NSID, name string) bool {
	s := set.String()
	group := strings.ToLower(s[:strings.LastIndexByte(s, '.')+1])
	return len(name) > len(group) && strings.ToLower(name[:len(group)]) == group
}

// expand is what the set grants through an include with audience aud
// ("" when the include names none), as scope strings.
func (ps *permissionSet) expand(aud string) []string {
	var out []string
	for _, p := range ps.perms {
		perm := auth.Permission{Resource: p.resource, Collection: p.collection, Action: p.action}
		if p.resource == "rpc" {
			perm = auth.Permission{Resource: "rpc", Endpoint: p.lxm, Audience: p.aud}
			if p.inheritAud {
				if aud == "" {
					continue
				}
				perm.Audience = aud
			}
		}
		// "*" needs no escaping in a query; written plainly, as the
		// reference server writes it.
		if s := strings.ReplaceAll(perm.ScopeString(), "%2A", "*"); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// size is what the set costs in the cache, roughly.
func (ps *permissionSet) size() int {
	n := len(ps.NSID) + len(ps.Title) + len(ps.Detail) + 64
	for _, p := range ps.perms {
		for _, l := range [][]string{p.collection, p.action, p.lxm} {
			for _, s := range l {
				n += len(s) + 16
			}
		}
		n += len(p.aud) + 64
	}
	return n
}

// shownText is a publisher's text as a page may show it: control and
// formatting characters (bidirectional overrides among them) removed,
// spaces collapsed, at most n characters.
func shownText(s string, n int) string {
	s = strings.ToValidUTF8(s, "")
	var b strings.Builder
	count := 0
	for _, r := range strings.Join(strings.FieldsFunc(s, unicode.IsSpace), " ") {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			continue
		}
		if count == n {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
		count++
	}
	return b.String()
}

// include is an include: scope value: the set and the audience its
// inheriting rpc permissions get.
type include struct {
	NSID syntax.NSID
	Aud  string
}

// parseInclude reads an include: scope value. Its aud, when present, must
// be a DID service reference (did:...#service), as the reference server
// requires.
func parseInclude(tok string) (include, bool) {
	perm, err := auth.ParsePermissionString(tok)
	if err != nil || perm.Resource != "include" {
		return include{}, false
	}
	if perm.Audience != "" && !isServiceRef(perm.Audience) {
		return include{}, false
	}
	return include{NSID: syntax.NSID(perm.NSID), Aud: perm.Audience}, true
}

// isServiceRef reports whether s is a DID followed by a #service fragment.
func isServiceRef(s string) bool {
	did, frag, ok := strings.Cut(s, "#")
	if !ok || frag == "" || strings.ContainsAny(frag, "#?/ ") {
		return false
	}
	_, err := syntax.ParseDID(did)
	return err == nil
}
