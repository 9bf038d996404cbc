package main

import (
	"context"
	"encoding/json"
	"flag"
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

// accountCommand runs `bulwark admin account SUBCOMMAND ...`; tokens is
// the one this file provides.
func (c *adminClient) accountCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 || args[0] != "tokens" {
		return usageError("usage: bulwark admin account tokens ACCOUNT [--json]")
	}
	fs := flag.NewFlagSet("account tokens", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	var pos []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		if fs.NArg() == 0 {
			break
		}
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) != 1 {
		return usageError("usage: bulwark admin account tokens ACCOUNT [--json] (ACCOUNT is a handle or DID)")
	}
	p, err := c.fetchPendingEmailTokens(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := json.MarshalIndent(p, "", "  ")
		if err != nil {
			return err
		}
		_, err = out.Write(append(b, '\n'))
		return err
	}
	return printPendingEmailTokens(out, p)
}
