package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// inviteCommands mint invite codes (com.atproto.server.createInviteCode).
var inviteCommands = []*adminCommand{
	{path: "invite create", args: "[--uses N] [--count N] [--for DID]",
		summary: "mint invite codes and print them, one a line", run: runInviteCreate},
}

// crawlCommands ask relays to crawl the server.
var crawlCommands = []*adminCommand{
	{path: "request-crawl", args: "[RELAY ...]",
		summary: "ask relays (default: the server's --crawlers) to crawl the server now (" + AdminNSIDPrefix + "requestCrawl)", run: runRequestCrawl},
}

// createdAccount is what `account create` prints.
type createdAccount struct {
	DID        string `json:"did"`
	Handle     string `json:"handle"`
	Email      string `json:"email"`
	Password   string `json:"password"`
	InviteCode string `json:"inviteCode,omitempty"`
}

func runAccountCreate(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	handle := fs.String("handle", "", "the new account's handle; a bare name gets the server's first handle domain")
	email := fs.String("email", "", "the new account's email address")
	password := fs.String("password", "", "its password (default: generated and printed)")
	invite := fs.String("invite-code", "", "an invite code to use (default: minted with the admin password when the server requires one)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	if *handle == "" || *email == "" {
		return usageError("account create needs --handle and --email")
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	var desc comatproto.ServerDescribeServer_Output
	if err := c.xrpc(ctx, http.MethodGet, "com.atproto.server.describeServer", nil, nil, &desc, false); err != nil {
		return err
	}
	h := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(*handle), "@"))
	if !strings.Contains(h, ".") && len(desc.AvailableUserDomains) > 0 {
		h += desc.AvailableUserDomains[0]
	}
	if _, err := syntax.ParseHandle(h); err != nil {
		return usageError(fmt.Sprintf("--handle %q: %v", *handle, err))
	}
	out := createdAccount{Handle: h, Email: *email, Password: *password, InviteCode: *invite}
	if out.Password == "" {
		out.Password = rand.Text()
	}
	if out.InviteCode == "" && desc.InviteCodeRequired != nil && *desc.InviteCodeRequired {
		var code struct {
			Code string `json:"code"`
		}
		if err := c.xrpc(ctx, http.MethodPost, "com.atproto.server.createInviteCode", nil, map[string]any{"useCount": 1}, &code, true); err != nil {
			return fmt.Errorf("the server requires an invite code; minting one: %w", err)
		}
		out.InviteCode = code.Code
	}
	in := map[string]string{"handle": out.Handle, "email": out.Email, "password": out.Password}
	if out.InviteCode != "" {
		in["inviteCode"] = out.InviteCode
	}
	var res struct {
		DID    string `json:"did"`
		Handle string `json:"handle"`
	}
	// With the admin password at hand the creation is the administrator's,
	// and the server audits it; without, it is an ordinary sign-up.
	_, noPassword := a.adminPassword()
	if err := c.xrpc(ctx, http.MethodPost, "com.atproto.server.createAccount", nil, in, &res, noPassword == nil); err != nil {
		return err
	}
	out.DID, out.Handle = res.DID, res.Handle
	return a.output(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "DID\t%s\nHandle\t%s\nEmail\t%s\nPassword\t%s\n", out.DID, out.Handle, out.Email, out.Password)
		if err := tw.Flush(); err != nil {
			return err
		}
		if *password == "" {
			_, err := fmt.Fprintln(w, "\nKeep the password: it is shown only once (account reset-password sets a new one).")
			return err
		}
		return nil
	})
}

func runInviteCreate(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	uses := fs.Int("uses", 1, "how many accounts each code may create")
	count := fs.Int("count", 1, "how many codes")
	forDID := fs.String("for", "", "the DID of the account the codes belong to (default: the admin)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	if *uses < 1 || *count < 1 || *count > 1000 {
		return usageError("invite create: --uses must be at least 1, --count between 1 and 1000")
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	in := map[string]any{"useCount": *uses}
	if *forDID != "" {
		did, err := syntax.ParseDID(*forDID)
		if err != nil {
			return usageError(fmt.Sprintf("--for %q: %v", *forDID, err))
		}
		in["forAccount"] = did.String()
	}
	codes := []string{}
	for range *count {
		var res struct {
			Code string `json:"code"`
		}
		if err := c.xrpc(ctx, http.MethodPost, "com.atproto.server.createInviteCode", nil, in, &res, true); err != nil {
			return err
		}
		codes = append(codes, res.Code)
	}
	return a.output(map[string]any{"codes": codes, "uses": *uses}, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, strings.Join(codes, "\n"))
		return err
	})
}

// crawlResult is one relay's answer, as requestCrawl reports it.
type crawlResult struct {
	Relay string `json:"relay"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func runRequestCrawl(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	relays, err := a.parse(cmd, fs, args, -1)
	if err != nil {
		return err
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	var out struct {
		Hostname string        `json:"hostname"`
		Results  []crawlResult `json:"results"`
	}
	bodies := []map[string]string{{}}
	if len(relays) > 0 {
		bodies = bodies[:0]
		for _, r := range relays {
			bodies = append(bodies, map[string]string{"relay": r})
		}
	}
	for _, body := range bodies {
		var res struct {
			Hostname string        `json:"hostname"`
			Results  []crawlResult `json:"results"`
		}
		if err := c.call(ctx, http.MethodPost, "requestCrawl", nil, body, &res); err != nil {
			return err
		}
		out.Hostname = res.Hostname
		out.Results = append(out.Results, res.Results...)
	}
	failed := 0
	for _, r := range out.Results {
		if !r.OK {
			failed++
		}
	}
	err = a.output(out, func(w io.Writer) error {
		fmt.Fprintf(w, "asked to crawl %s:\n", out.Hostname)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RELAY\tRESULT")
		for _, r := range out.Results {
			res := "ok"
			if !r.OK {
				res = "FAILED: " + r.Error
			}
			fmt.Fprintf(tw, "%s\t%s\n", r.Relay, res)
		}
		return tw.Flush()
	})
	if err == nil && failed > 0 {
		err = errors.New(fmt.Sprint(failed, " of ", len(out.Results), " relay(s) refused or could not be reached"))
	}
	return err
}
