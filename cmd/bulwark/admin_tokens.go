package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
)

// `bulwark admin account tokens ACCOUNT`: the codes an account asked for
// (email confirmation, password reset, account deletion, PLC operation)
// whose mail has not gone out, for an operator to pass on by other means
// when the server has no SMTP server (or its mail server is down). A thin
// client of io.github.bulwark-pds.admin.getPendingEmailTokens; the server
// records each read in the audit log.

// pendingEmailTokens is getPendingEmailTokens's answer.
type pendingEmailTokens struct {
	DID         string `json:"did"`
	Handle      string `json:"handle"`
	MailEnabled bool   `json:"mailEnabled"`
	Tokens      []struct {
		Purpose   string `json:"purpose"`
		Code      string `json:"code"`
		ExpiresAt string `json:"expiresAt"`
	} `json:"tokens"`
}

// fetchPendingEmailTokens asks the server for account's (a DID or handle)
// pending codes.
func (c *adminClient) fetchPendingEmailTokens(ctx context.Context, account string) (*pendingEmailTokens, error) {
	var res pendingEmailTokens
	if err := c.call(ctx, http.MethodGet, "getPendingEmailTokens", url.Values{"account": {account}}, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// printPendingEmailTokens writes p as a table, or says why there is none.
func printPendingEmailTokens(w io.Writer, p *pendingEmailTokens) error {
	if len(p.Tokens) == 0 {
		why := "mail sent, code used or replaced, or expired"
		if !p.MailEnabled {
			why = "none asked for, code used or replaced, or expired"
		}
		_, err := fmt.Fprintf(w, "%s (%s): no codes waiting (%s)\n", p.Handle, p.DID, why)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "# %s (%s)\n", p.Handle, p.DID)
	fmt.Fprintln(tw, "PURPOSE\tCODE\tEXPIRES")
	for _, t := range p.Tokens {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Purpose, t.Code, t.ExpiresAt)
	}
	return tw.Flush()
}

// runAccountTokens is `bulwark admin account tokens ACCOUNT`.
func runAccountTokens(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	pos, err := a.parse(cmd, fs, args, 1)
	if err != nil {
		return err
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	p, err := c.fetchPendingEmailTokens(ctx, pos[0])
	if err != nil {
		return err
	}
	return a.output(p, func(w io.Writer) error { return printPendingEmailTokens(w, p) })
}
