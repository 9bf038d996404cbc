package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxApplyWrites is the most writes one applyWrites may carry (the
// lexicon's and the repo engine's limit).
const maxApplyWrites = 200

// runSeed is "bulwark-load seed": log in to --handle (creating the account
// when that fails), write --records records to it with applyWrites, and
// print its DID on stdout. It sets up the repository the scrapers fetch
// (--did) and the writer's account (--records 0).
func runSeed(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		rawURL, handle, password, email, invite, collection string
		records, batch, textBytes                           int
	)
	fs := flag.NewFlagSet("bulwark-load seed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&rawURL, "url", "http://127.0.0.1:2583", "base URL of the PDS")
	fs.StringVar(&handle, "handle", "", "account handle (created if logging in fails)")
	fs.StringVar(&password, "password", "", "account password")
	fs.StringVar(&email, "email", "", "email for a new account (default <handle>@example.com)")
	fs.StringVar(&invite, "invite-code", "", "invite code for a new account, if the server requires one")
	fs.StringVar(&collection, "collection", "app.bsky.feed.post", "collection of the records written")
	fs.IntVar(&records, "records", 100_000, "records to write (0 = just make sure the account exists)")
	fs.IntVar(&batch, "batch", maxApplyWrites, "records per applyWrites (at most 200)")
	fs.IntVar(&textBytes, "text-bytes", 55, "length of each record's text (55: 100,000 records make a ~25 MB CAR)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `bulwark-load seed creates an account (or logs in to it), writes records to it
with applyWrites and prints its DID.

The default rate limits allow an account 5,000 write points an hour (3 per
record created): run the server with BULWARK_RATELIMITS='repoWrite=off'
while seeding a large repository, then restart it with the limits to test.

Usage:
  bulwark-load seed --handle big.test --password ... [--records 100000]

Flags (each also BULWARK_LOAD_<FLAG>):
`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, "bulwark-load seed", args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 || handle == "" || password == "" || records < 0 || batch < 1 || batch > maxApplyWrites {
		fmt.Fprintln(stderr, "bulwark-load seed: want --handle and --password, --records >= 0, --batch 1-200, no arguments")
		return 2
	}
	base, err := url.Parse(strings.TrimSuffix(rawURL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		fmt.Fprintf(stderr, "bulwark-load seed: --url %q: want http(s)://host[:port]\n", rawURL)
		return 2
	}
	if email == "" {
		email = handle + "@example.com"
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	w := &writer{client: &http.Client{Timeout: 60 * time.Second}, base: base, handle: handle, password: password, collection: collection}
	if err := ensureAccount(ctx, w, email, invite, logger); err != nil {
		fmt.Fprintln(stderr, "bulwark-load seed:", err)
		return 1
	}
	if err := seedRecords(ctx, w, records, batch, textBytes, logger); err != nil {
		fmt.Fprintln(stderr, "bulwark-load seed:", err)
		return 1
	}
	fmt.Fprintln(stdout, w.did)
	return 0
}

// ensureAccount logs w in, creating its account when logging in fails.
func ensureAccount(ctx context.Context, w *writer, email, invite string, logger *slog.Logger) error {
	loginErr := w.login(ctx)
	if loginErr == nil {
		logger.Info("logged in", "handle", w.handle, "did", w.did)
		return nil
	}
	in := map[string]string{"handle": w.handle, "email": email, "password": w.password}
	if invite != "" {
		in["inviteCode"] = invite
	}
	var out struct {
		DID       string `json:"did"`
		AccessJWT string `json:"accessJwt"`
	}
	if _, err := w.xrpc(ctx, "com.atproto.server.createAccount", "", in, &out); err != nil {
		return fmt.Errorf("log in: %v; create the account: %w", loginErr, err)
	}
	if out.DID == "" || out.AccessJWT == "" {
		return errors.New("createAccount: response without did or accessJwt")
	}
	w.did, w.accessJWT = out.DID, out.AccessJWT
	logger.Info("account created", "handle", w.handle, "did", w.did)
	return nil
}

// seedRecords writes n records to w's repository, batch per applyWrites.
func seedRecords(ctx context.Context, w *writer, n, batch, textBytes int, logger *slog.Logger) error {
	start := time.Now()
	lastLog := start
	filler := strings.Repeat("lorem ipsum dolor sit amet ", textBytes/27+1)
	relogged := false
	for done := 0; done < n; {
		k := min(batch, n-done)
		writes := make([]map[string]any, 0, k)
		for i := done; i < done+k; i++ {
			text := fmt.Sprintf("bulwark-load seed record %d: ", i)
			if len(text) < textBytes {
				text += filler[:textBytes-len(text)]
			}
			writes = append(writes, map[string]any{
				"$type":      "com.atproto.repo.applyWrites#create",
				"collection": w.collection,
				"value": map[string]any{
					"$type":     w.collection,
					"text":      text,
					"createdAt": time.Now().UTC().Format(time.RFC3339Nano),
				},
			})
		}
		in := map[string]any{"repo": w.did, "writes": writes}
		code, err := w.xrpc(ctx, "com.atproto.repo.applyWrites", w.accessJWT, in, nil)
		if code == http.StatusUnauthorized && !relogged {
			// The access token expired: log in again and retry the batch.
			if err := w.login(ctx); err != nil {
				return err
			}
			relogged = true
			continue
		}
		if code == http.StatusTooManyRequests {
			return fmt.Errorf("%w (after %d records; run the server with BULWARK_RATELIMITS='repoWrite=off' while seeding)", err, done)
		}
		if err != nil {
			return fmt.Errorf("after %d records: %w", done, err)
		}
		done += k
		relogged = false
		if time.Since(lastLog) >= 10*time.Second || done == n {
			lastLog = time.Now()
			logger.Info("seeding", "records", done, "of", n, "elapsed", time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
}
