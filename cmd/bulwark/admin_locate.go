package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/serverid"
)

// locateServer picks the server `bulwark admin` talks to and what it must
// prove first:
//
//   - without --url, the server the data directory records (its runtime
//     file), which must prove it is that server;
//   - with --url, that URL, which must prove it is the data directory's
//     server when the data directory was named or the admin password
//     comes from it; otherwise (or with no server recorded) it is used as
//     given, and a note on stderr says so.
func (a *adminRun) locateServer() (*adminClient, error) {
	c := &adminClient{run: a, http: &http.Client{Timeout: adminTimeout}}
	rt, rtErr := serverid.ReadRuntime(a.dataDir)
	if rtErr != nil && !errors.Is(rtErr, serverid.ErrNoRuntime) {
		return nil, fmt.Errorf("the server of data directory %s: %w", a.absDataDir(), rtErr)
	}
	if !a.urlSet {
		if rtErr != nil {
			return nil, fmt.Errorf("cannot find the server of data directory %s: no running server recorded there (%s). "+
				"Start it (bulwark serve --data-dir %s), point --data-dir (BULWARK_DATA_DIR) at the data directory it runs with, "+
				"or name the server with --url (BULWARK_ADMIN_URL)",
				a.absDataDir(), serverid.RuntimeFile, shellQuote(a.dataDir))
		}
		c.base, c.server = rt.AdminURL, rt
		return c, nil
	}
	base, err := serverid.CanonicalURL(a.url)
	if err != nil {
		return nil, usageError(fmt.Sprintf("--url %q is not an http(s) base URL", a.url))
	}
	c.base = base
	passwordFromDir := a.password == "" && strings.TrimSpace(os.Getenv("BULWARK_ADMIN_PASSWORD")) == ""
	switch {
	case rtErr == nil && (a.dataDirSet || passwordFromDir):
		c.server = rt
	case rtErr == nil:
		fmt.Fprintf(a.stderr, "bulwark admin: note: %s is used as --url names it, with the given admin password; it is not checked against the server of %s (pass --data-dir to check it)\n",
			base, a.absDataDir())
	default:
		fmt.Fprintf(a.stderr, "bulwark admin: note: no running server is recorded in %s, so %s cannot be checked to be its server; using it as --url names it\n",
			a.absDataDir(), base)
	}
	return c, nil
}

// confirmTimeout bounds the identity question: a server answers it at
// once, and a program that holds it open gets nothing by waiting.
const confirmTimeout = 15 * time.Second

// confirm makes the server prove, once, that it is the server the data
// directory records, before anything (credentials above all) is sent.
func (c *adminClient) confirm(ctx context.Context) error {
	if c.server == nil {
		return nil
	}
	rt := c.server
	cctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	err := serverid.Confirm(cctx, c.http, c.base, rt)
	switch {
	case err == nil:
		c.server = nil
		return nil
	case errors.Is(err, serverid.ErrNotConfirmed):
		return fmt.Errorf("the server at %s is not the server of data directory %s (%v); the admin password was not sent. "+
			"Another program may be using the address; the data directory's server recorded %s (pid %d)",
			c.base, c.run.absDataDir(), err, rt.AdminURL, rt.PID)
	case c.base != rt.AdminURL:
		return fmt.Errorf("cannot reach %s to check that it is the server of data directory %s (which recorded %s): %w",
			c.base, c.run.absDataDir(), rt.AdminURL, err)
	default:
		return fmt.Errorf("cannot reach the server of data directory %s at %s (recorded by pid %d at %s; is it still running?): %w",
			c.run.absDataDir(), c.base, rt.PID, rt.Started.Format("2006-01-02 15:04:05Z"), err)
	}
}

func (a *adminRun) absDataDir() string {
	if abs, err := filepath.Abs(a.dataDir); err == nil {
		return abs
	}
	return a.dataDir
}
