package oauth

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/bluesky-social/indigo/atproto/auth"
)

// DescribeScope explains a scope in plain words, one line per permission,
// for the consent and account pages.
func DescribeScope(scope string) []string {
	toks := strings.Fields(scope)
	out := []string{"Know which account you are (your handle and DID)."}
	if slices.Contains(toks, ScopeGeneric) {
		out = append(out, "Create, change and delete your posts, likes, follows and other records; upload pictures and videos; read and change your settings; and use other atproto services on your behalf. It cannot change your handle, email or password, or delete or move your account.")
		if slices.Contains(toks, ScopeChat) {
			out = append(out, "Read and send your direct messages.")
		}
	}
	if slices.Contains(toks, ScopeEmail) {
		out = append(out, "See your email address and whether it is confirmed.")
	}
	for _, tok := range toks {
		switch tok {
		case ScopeAtproto, ScopeGeneric, ScopeChat, ScopeEmail:
			continue
		}
		perm, err := auth.ParsePermissionString(tok)
		if err != nil {
			continue
		}
		if line := describePermission(perm); line != "" {
			out = append(out, line)
		}
	}
	return out
}

func describePermission(p *auth.Permission) string {
	switch p.Resource {
	case "repo":
		return fmt.Sprintf("%s %s in your repository.", describeActions(p.Action), describeList(p.Collection, "records of any kind", "records of kind "))
	case "blob":
		return fmt.Sprintf("Upload %s.", describeList(p.Accept, "files of any type", "files of type "))
	case "rpc":
		aud := "any service"
		if p.Audience != "*" {
			aud = "the service " + p.Audience
		}
		return fmt.Sprintf("Call %s on %s on your behalf.", describeList(p.Endpoint, "any method", "the method "), aud)
	case "account":
		manage := slices.Contains(p.Action, ActionManage)
		switch {
		case p.Attribute == "email" && manage:
			return "See and change your email address."
		case p.Attribute == "email":
			return "See your email address."
		case p.Attribute == "repo" && manage:
			return "Replace your whole repository (import a backup or move an account here)."
		}
	case "identity":
		if p.Attribute == "*" {
			return "Change your handle and your identity document, including moving your account to another server."
		}
		return "Change your handle."
	}
	return ""
}

func describeActions(actions []string) string {
	if len(actions) == 0 || len(actions) == 3 {
		return "Create, change and delete"
	}
	words := map[string]string{ActionCreate: "create", ActionUpdate: "change", ActionDelete: "delete"}
	var out []string
	for _, a := range []string{ActionCreate, ActionUpdate, ActionDelete} {
		if slices.Contains(actions, a) {
			out = append(out, words[a])
		}
	}
	s := strings.Join(out, " and ")
	return strings.ToUpper(s[:1]) + s[1:]
}

func describeList(items []string, all, prefix string) string {
	if slices.Contains(items, "*") || slices.Contains(items, "*/*") {
		return all
	}
	return prefix + strings.Join(items, ", ")
}

// permissionGroup is a permission set on the consent and account pages:
// its publisher's title and detail, and what it grants in plain words.
type permissionGroup struct {
	NSID      string
	Authority string
	Title     string
	Detail    string
	Lines     []string
}

// describeSets resolves the permission sets of scope (cached since the
// request was pushed) and describes each as the include asks for it.
// Errors are tokenScope's.
func (s *Server) describeSets(ctx context.Context, scope string) ([]permissionGroup, error) {
	incs := includesOf(scope)
	if len(incs) == 0 {
		return nil, nil
	}
	if s.sets == nil {
		return nil, oauthErr(http.StatusBadRequest, CodeInvalidScope, "permission sets are not supported by this server")
	}
	sets, err := s.sets.getAll(ctx, incs)
	if err != nil {
		return nil, err
	}
	out := make([]permissionGroup, 0, len(incs))
	for _, inc := range incs {
		out = append(out, describeSet(inc, sets[inc.NSID]))
	}
	return out, nil
}

// describeSet is what set grants through inc, in plain words.
func describeSet(inc include, set *permissionSet) permissionGroup {
	g := permissionGroup{NSID: inc.NSID.String(), Authority: inc.NSID.Authority()}
	if set != nil {
		g.Title, g.Detail = set.Title, set.Detail
		for _, tok := range set.expand(inc.Aud) {
			if perm, err := auth.ParsePermissionString(tok); err == nil {
				if line := describePermission(perm); line != "" {
					g.Lines = append(g.Lines, line)
				}
			}
		}
	}
	if len(g.Lines) == 0 {
		g.Lines = []string{"Nothing: this set grants no permission this server can give."}
	}
	return g
}

// describeGrantSets names a grant's permission sets for the account page
// (what they grant is among the grant's permissions), with the titles the
// cache knows; nothing is resolved for a page view.
func (s *Server) describeGrantSets(scope string) []permissionGroup {
	var out []permissionGroup
	for _, inc := range includesOf(scope) {
		g := permissionGroup{NSID: inc.NSID.String(), Authority: inc.NSID.Authority()}
		if s.sets != nil {
			if set := s.sets.peek(inc.NSID); set != nil {
				g.Title, g.Detail = set.Title, set.Detail
			}
		}
		out = append(out, g)
	}
	return out
}
