package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// accountCommands manage accounts through com.atproto.admin.* and
// com.atproto.server.createAccount, the calls goat's `pds admin` makes.
var accountCommands = []*adminCommand{
	{path: "account list", args: "",
		summary: "every account: handle, email, DID, status, creation time (sync.listRepos + admin.getAccountInfos)", run: runAccountList},
	{path: "account create", args: "--handle HANDLE --email EMAIL [--password PW] [--invite-code CODE]",
		summary: "create an account and print its DID, handle and password (generated unless given); when the server requires invites, a one-use invite is minted with the admin password", run: runAccountCreate},
	{path: "account info", args: "ACCOUNT",
		summary: "an account's details and moderation status (admin.getAccountInfo, admin.getSubjectStatus)", run: runAccountInfo},
	{path: "account delete", args: "ACCOUNT --yes",
		summary: "delete an account, its repository and blobs, for good (admin.deleteAccount)", run: runAccountDelete},
	{path: "account takedown", args: "ACCOUNT [--ref REF]",
		summary: "take an account down: its repository stops being served and its sessions end (admin.updateSubjectStatus)", run: runAccountTakedown},
	{path: "account untakedown", args: "ACCOUNT",
		summary: "reverse a takedown (admin.updateSubjectStatus)", run: runAccountTakedown},
	{path: "account reset-password", args: "ACCOUNT",
		summary: "set a new generated password, print it, and end the account's sessions (admin.updateAccountPassword)", run: runAccountResetPassword},
	{path: "account update-handle", args: "ACCOUNT HANDLE",
		summary: "change an account's handle (admin.updateAccountHandle)", run: runAccountUpdateHandle},
	{path: "account update-email", args: "ACCOUNT EMAIL",
		summary: "change an account's email address (admin.updateAccountEmail)", run: runAccountUpdateEmail},
	{path: "account export", args: "ACCOUNT DIR",
		summary: "write the account's repository CAR, every blob and its preferences to DIR, with a manifest (sync.getRepo, sync.listBlobs, sync.getBlob, admin getPreferences)", run: runAccountExport},
	{path: "account import", args: "[--reason TEXT] ACCOUNT CAR",
		summary: "replace the account's repository with a CAR, e.g. one account export wrote (io.github.bulwark-pds.admin.importRepo)", run: runAccountImport},
	{path: "account tokens", args: "ACCOUNT",
		summary: "codes the account asked for (email confirmation, password reset, deletion, PLC operation) whose mail has not gone out, for when the server has no SMTP (io.github.bulwark-pds.admin.getPendingEmailTokens)", run: runAccountTokens},
}

// listReposPage is how many repositories one listRepos call asks for: the
// method's largest page, which is also getAccountInfos's largest batch.
const listReposPage = 1000

// accountRow is one line of `account list`.
type accountRow struct {
	DID       string `json:"did"`
	Handle    string `json:"handle,omitempty"`
	Email     string `json:"email,omitempty"`
	Status    string `json:"status"`
	Rev       string `json:"rev,omitempty"`
	CreatedAt string `json:"createdAt,omitempty"`
}

func runAccountList(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	rows := []accountRow{}
	cursor := ""
	for {
		q := url.Values{"limit": {fmt.Sprint(listReposPage)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page comatproto.SyncListRepos_Output
		if err := c.xrpc(ctx, http.MethodGet, "com.atproto.sync.listRepos", q, nil, &page, false); err != nil {
			return err
		}
		more, err := c.accountRows(ctx, page.Repos)
		if err != nil {
			return err
		}
		rows = append(rows, more...)
		if page.Cursor == nil || *page.Cursor == "" || len(page.Repos) == 0 {
			break
		}
		cursor = *page.Cursor
	}
	return a.output(map[string]any{"accounts": rows}, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HANDLE\tEMAIL\tDID\tSTATUS\tCREATED")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", orDash(r.Handle), orDash(r.Email), r.DID, r.Status, orDash(r.CreatedAt))
		}
		return tw.Flush()
	})
}

// accountRows joins one listRepos page with the accounts' admin views. A
// repository whose account is gone (deleted) has no view and keeps only
// its DID and status.
func (c *adminClient) accountRows(ctx context.Context, repos []*comatproto.SyncListRepos_Repo) ([]accountRow, error) {
	if len(repos) == 0 {
		// Nothing to ask about; still check the password, so that a wrong
		// one is not taken for an empty server.
		q := url.Values{"limit": {"1"}}
		return nil, c.xrpc(ctx, http.MethodGet, "com.atproto.admin.getInviteCodes", q, nil, nil, true)
	}
	q := url.Values{}
	for _, r := range repos {
		q.Add("dids", r.Did)
	}
	var infos comatproto.AdminGetAccountInfos_Output
	if err := c.xrpc(ctx, http.MethodGet, "com.atproto.admin.getAccountInfos", q, nil, &infos, true); err != nil {
		return nil, err
	}
	views := make(map[string]*comatproto.AdminDefs_AccountView, len(infos.Infos))
	for _, v := range infos.Infos {
		views[v.Did] = v
	}
	rows := make([]accountRow, 0, len(repos))
	for _, r := range repos {
		row := accountRow{DID: r.Did, Rev: r.Rev, Status: "active"}
		if r.Status != nil && *r.Status != "" {
			row.Status = *r.Status
		}
		if v := views[r.Did]; v != nil {
			row.Handle, row.CreatedAt = v.Handle, v.IndexedAt
			if v.Email != nil {
				row.Email = *v.Email
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// resolveAccount turns ACCOUNT (a DID, or a handle the server resolves) into
// a DID.
func (c *adminClient) resolveAccount(ctx context.Context, raw string) (syntax.DID, error) {
	raw = strings.TrimPrefix(strings.TrimSpace(raw), "@")
	if strings.HasPrefix(raw, "did:") {
		did, err := syntax.ParseDID(raw)
		if err != nil {
			return "", usageError(fmt.Sprintf("%q is not a DID: %v", raw, err))
		}
		return did, nil
	}
	h, err := syntax.ParseHandle(raw)
	if err != nil {
		return "", usageError(fmt.Sprintf("%q is neither a DID nor a handle", raw))
	}
	var out comatproto.IdentityResolveHandle_Output
	q := url.Values{"handle": {h.Normalize().String()}}
	if err := c.xrpc(ctx, http.MethodGet, "com.atproto.identity.resolveHandle", q, nil, &out, false); err != nil {
		return "", fmt.Errorf("resolve handle %s: %w", h, err)
	}
	return syntax.ParseDID(out.Did)
}

// account returns the client and the DID of ACCOUNT (a DID or a handle).
func (a *adminRun) account(ctx context.Context, raw string) (*adminClient, syntax.DID, error) {
	c, err := a.conn()
	if err != nil {
		return nil, "", err
	}
	did, err := c.resolveAccount(ctx, raw)
	return c, did, err
}

// parseAccount parses the arguments of a command whose first one is
// ACCOUNT (nargs in all) and resolves it: the client, the DID and the
// arguments.
func (a *adminRun) parseAccount(ctx context.Context, cmd *adminCommand, fs *flag.FlagSet, args []string, nargs int) (*adminClient, syntax.DID, []string, error) {
	pos, err := a.parse(cmd, fs, args, nargs)
	if err != nil {
		return nil, "", nil, err
	}
	c, did, err := a.account(ctx, pos[0])
	return c, did, pos, err
}

type accountInfoOutput struct {
	Account     *comatproto.AdminDefs_AccountView `json:"account"`
	Takedown    *comatproto.AdminDefs_StatusAttr  `json:"takedown,omitempty"`
	Deactivated *comatproto.AdminDefs_StatusAttr  `json:"deactivated,omitempty"`
}

func runAccountInfo(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	c, did, _, err := a.parseAccount(ctx, cmd, fs, args, 1)
	if err != nil {
		return err
	}
	var out accountInfoOutput
	q := url.Values{"did": {did.String()}}
	if err := c.xrpc(ctx, http.MethodGet, "com.atproto.admin.getAccountInfo", q, nil, &out.Account, true); err != nil {
		return err
	}
	var st comatproto.AdminGetSubjectStatus_Output
	if err := c.xrpc(ctx, http.MethodGet, "com.atproto.admin.getSubjectStatus", q, nil, &st, true); err != nil {
		return err
	}
	out.Takedown, out.Deactivated = st.Takedown, st.Deactivated
	return a.output(out, func(w io.Writer) error {
		v := out.Account
		status := "active"
		switch {
		case out.Takedown != nil && out.Takedown.Applied:
			status = "takendown"
			if out.Takedown.Ref != nil && *out.Takedown.Ref != "" {
				status += " (ref " + *out.Takedown.Ref + ")"
			}
		case out.Deactivated != nil && out.Deactivated.Applied:
			status = "deactivated"
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "DID\t%s\n", v.Did)
		fmt.Fprintf(tw, "Handle\t%s\n", v.Handle)
		fmt.Fprintf(tw, "Email\t%s\n", orDash(deref(v.Email)))
		fmt.Fprintf(tw, "Status\t%s\n", status)
		fmt.Fprintf(tw, "Created\t%s\n", v.IndexedAt)
		if v.InvitedBy != nil {
			fmt.Fprintf(tw, "Invited with\t%s\n", v.InvitedBy.Code)
		}
		invites := "enabled"
		if v.InvitesDisabled != nil && *v.InvitesDisabled {
			invites = "disabled"
		}
		fmt.Fprintf(tw, "Invites\t%s, %d code(s)\n", invites, len(v.Invites))
		if v.InviteNote != nil && *v.InviteNote != "" {
			fmt.Fprintf(tw, "Invite note\t%s\n", *v.InviteNote)
		}
		return tw.Flush()
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// accountChange is what the commands that change an account print with
// --json.
type accountChange struct {
	DID      string `json:"did"`
	Action   string `json:"action"`
	Handle   string `json:"handle,omitempty"`
	Email    string `json:"email,omitempty"`
	Password string `json:"password,omitempty"`
}

// printChange prints ch: a line for people, the object with --json.
func (a *adminRun) printChange(ch accountChange, line string) error {
	return a.output(ch, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, line)
		return err
	})
}

func runAccountDelete(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	yes := fs.Bool("yes", false, "confirm: the account, its repository and its blobs are deleted for good")
	pos, err := a.parse(cmd, fs, args, 1)
	if err != nil {
		return err
	}
	if !*yes {
		return usageError("account delete is permanent: add --yes to confirm")
	}
	c, did, err := a.account(ctx, pos[0])
	if err != nil {
		return err
	}
	if err := c.xrpc(ctx, http.MethodPost, "com.atproto.admin.deleteAccount", nil, map[string]string{"did": did.String()}, nil, true); err != nil {
		return err
	}
	return a.printChange(accountChange{DID: did.String(), Action: "deleted"}, "deleted "+did.String())
}

func runAccountTakedown(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	apply := cmd.path == "account takedown"
	var ref *string
	if apply {
		ref = fs.String("ref", "", "a reference kept with the takedown (a ticket, a report)")
	}
	c, did, _, err := a.parseAccount(ctx, cmd, fs, args, 1)
	if err != nil {
		return err
	}
	takedown := map[string]any{"applied": apply}
	if ref != nil && *ref != "" {
		takedown["ref"] = *ref
	}
	body := map[string]any{
		"subject":  map[string]string{"$type": "com.atproto.admin.defs#repoRef", "did": did.String()},
		"takedown": takedown,
	}
	if err := c.xrpc(ctx, http.MethodPost, "com.atproto.admin.updateSubjectStatus", nil, body, nil, true); err != nil {
		return err
	}
	if apply {
		return a.printChange(accountChange{DID: did.String(), Action: "takendown"}, "took down "+did.String())
	}
	return a.printChange(accountChange{DID: did.String(), Action: "untakendown"}, "reversed the takedown of "+did.String())
}

func runAccountResetPassword(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	c, did, _, err := a.parseAccount(ctx, cmd, fs, args, 1)
	if err != nil {
		return err
	}
	pw := rand.Text()
	body := map[string]string{"did": did.String(), "password": pw}
	if err := c.xrpc(ctx, http.MethodPost, "com.atproto.admin.updateAccountPassword", nil, body, nil, true); err != nil {
		return err
	}
	return a.output(accountChange{DID: did.String(), Action: "password-reset", Password: pw}, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "DID\t%s\nNew password\t%s\n", did, pw)
		return tw.Flush()
	})
}

func runAccountUpdateHandle(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	pos, err := a.parse(cmd, fs, args, 2)
	if err != nil {
		return err
	}
	h, err := syntax.ParseHandle(strings.TrimPrefix(pos[1], "@"))
	if err != nil {
		return usageError(fmt.Sprintf("%q is not a handle: %v", pos[1], err))
	}
	c, did, err := a.account(ctx, pos[0])
	if err != nil {
		return err
	}
	body := map[string]string{"did": did.String(), "handle": h.Normalize().String()}
	if err := c.xrpc(ctx, http.MethodPost, "com.atproto.admin.updateAccountHandle", nil, body, nil, true); err != nil {
		return err
	}
	return a.printChange(accountChange{DID: did.String(), Action: "handle-updated", Handle: h.Normalize().String()},
		fmt.Sprintf("handle of %s is now %s", did, h.Normalize()))
}

func runAccountUpdateEmail(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	c, did, pos, err := a.parseAccount(ctx, cmd, fs, args, 2)
	if err != nil {
		return err
	}
	body := map[string]string{"account": did.String(), "email": pos[1]}
	if err := c.xrpc(ctx, http.MethodPost, "com.atproto.admin.updateAccountEmail", nil, body, nil, true); err != nil {
		return err
	}
	return a.printChange(accountChange{DID: did.String(), Action: "email-updated", Email: pos[1]},
		fmt.Sprintf("email of %s is now %s", did, pos[1]))
}
