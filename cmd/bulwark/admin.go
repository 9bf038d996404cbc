package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bulwark-pds/bulwark/config"
)

// AdminNSIDPrefix is the namespace of Bulwark's own admin methods. The NSID
// authority io.github.bulwark-pds is the project's GitHub organisation
// (bulwark-pds.github.io), which the project controls.
const AdminNSIDPrefix = "io.github.bulwark-pds.admin."

// adminClient calls admin XRPC methods of a running server with HTTP Basic
// admin credentials.
type adminClient struct {
	base     string
	password string
	http     *http.Client
}

func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	serverURL := fs.String("url", envOr("BULWARK_ADMIN_URL", "http://127.0.0.1:2583"), "server base URL (env BULWARK_ADMIN_URL)")
	password := fs.String("admin-password", os.Getenv("BULWARK_ADMIN_PASSWORD"), "admin password (env BULWARK_ADMIN_PASSWORD; default: read from <data-dir>/secrets)")
	dataDir := fs.String("data-dir", envOr("BULWARK_DATA_DIR", "./data"), "data directory to read the generated admin password from")
	fs.Usage = func() { adminUsage(stderr) }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *password == "" {
		b, err := os.ReadFile(filepath.Join(*dataDir, config.SecretsDir, "admin-password"))
		if err != nil {
			fmt.Fprintf(stderr, "bulwark admin: no admin password: pass --admin-password or BULWARK_ADMIN_PASSWORD (%v)\n", err)
			return 2
		}
		*password = strings.TrimSpace(string(b))
	}
	c := &adminClient{base: strings.TrimRight(*serverURL, "/"), password: *password, http: &http.Client{Timeout: 2 * time.Minute}}
	rest := fs.Args()
	if len(rest) < 1 {
		adminUsage(stderr)
		return 2
	}
	var err error
	switch rest[0] {
	case "firehose":
		err = c.firehose(ctx, rest[1:], stdout)
	case "audit":
		err = c.audit(ctx, rest[1:], stdout)
	case "account":
		err = c.accountCommand(ctx, rest[1:], stdout)
	default:
		err = usageError(fmt.Sprintf("unknown admin command %q", rest[0]))
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "bulwark admin: %s\n\n", ue)
		adminUsage(stderr)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "bulwark admin: %v\n", err)
		return 1
	}
	return 0
}

type usageError string

func (e usageError) Error() string { return string(e) }

func adminUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: bulwark admin [--url URL] [--admin-password PW] COMMAND

Firehose inspection and repair (each repair is transactional, idempotent
and recorded in the audit log):
  firehose events [--from SEQ] [--to SEQ] [--did DID] [--kind K] [--over-limits] [--limit N]
  firehose rewrite-as-sync --seq SEQ [--reason TEXT]
  firehose invalidate --seq SEQ [--reason TEXT]
  firehose emit-sync --did DID [--reason TEXT]
  firehose raise-seq --floor SEQ [--reason TEXT]
  firehose repair-oversized [--reason TEXT]
  firehose consumers
  audit [--subject S] [--limit N]

Accounts:
  account export <did|handle> <dir>            repository CAR, blobs and a manifest
  account import [--reason TEXT] <did|handle> <car>
                                               replace the repository with a CAR

The password defaults to the one generated in <data-dir>/secrets.
`)
}

func (c *adminClient) firehose(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 {
		return usageError("firehose needs a subcommand")
	}
	fs := flag.NewFlagSet("firehose "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	seq := fs.Int64("seq", 0, "event seq")
	floor := fs.Int64("floor", 0, "seq floor")
	did := fs.String("did", "", "repo DID")
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	from := fs.Int64("from", 0, "first seq")
	to := fs.Int64("to", 0, "last seq")
	kind := fs.String("kind", "", "commit, sync, identity or account")
	over := fs.Bool("over-limits", false, "only events that break a protocol limit")
	limit := fs.Int("limit", 100, "how many")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError(err.Error())
	}
	switch args[0] {
	case "events":
		q := url.Values{"from": {fmt.Sprint(*from)}, "limit": {fmt.Sprint(*limit)}}
		if *to > 0 {
			q.Set("to", fmt.Sprint(*to))
		}
		if *did != "" {
			q.Set("did", *did)
		}
		if *kind != "" {
			q.Set("kind", *kind)
		}
		if *over {
			q.Set("overLimits", "true")
		}
		var res struct {
			Events []struct {
				Seq         int64    `json:"seq"`
				DID         string   `json:"did"`
				Kind        string   `json:"kind"`
				Rev         string   `json:"rev"`
				CreatedAt   string   `json:"createdAt"`
				FrameBytes  int      `json:"frameBytes"`
				BlocksBytes int      `json:"blocksBytes"`
				Ops         int      `json:"ops"`
				Invalidated bool     `json:"invalidated"`
				Problems    []string `json:"problems"`
			} `json:"events"`
		}
		if err := c.call(ctx, http.MethodGet, "listEvents", q, nil, &res); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tKIND\tDID\tREV\tFRAME\tBLOCKS\tOPS\tSTATE")
		for _, e := range res.Events {
			state := "ok"
			if e.Invalidated {
				state = "invalidated"
			} else if len(e.Problems) > 0 {
				state = "OVER LIMITS: " + strings.Join(e.Problems, "; ")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", e.Seq, e.Kind, e.DID, e.Rev, e.FrameBytes, e.BlocksBytes, e.Ops, state)
		}
		return tw.Flush()
	case "rewrite-as-sync", "invalidate":
		if *seq <= 0 {
			return usageError(args[0] + " needs --seq")
		}
		nsid := map[string]string{"rewrite-as-sync": "rewriteEventAsSync", "invalidate": "invalidateEvent"}[args[0]]
		return c.callPrint(ctx, nsid, map[string]any{"seq": *seq, "reason": *reason}, out)
	case "emit-sync":
		if *did == "" {
			return usageError("emit-sync needs --did")
		}
		return c.callPrint(ctx, "emitSync", map[string]any{"did": *did, "reason": *reason}, out)
	case "raise-seq":
		if *floor <= 0 {
			return usageError("raise-seq needs --floor")
		}
		return c.callPrint(ctx, "raiseSeq", map[string]any{"floor": *floor, "reason": *reason}, out)
	case "repair-oversized":
		return c.callPrint(ctx, "repairOversizedEvents", map[string]any{"reason": *reason}, out)
	case "consumers":
		var res json.RawMessage
		if err := c.call(ctx, http.MethodGet, "listConsumers", nil, nil, &res); err != nil {
			return err
		}
		return printJSON(out, res)
	}
	return usageError(fmt.Sprintf("unknown firehose command %q", args[0]))
}

func (c *adminClient) audit(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	subject := fs.String("subject", "", "only entries about this subject (a DID, seq:N, ...)")
	limit := fs.Int("limit", 50, "how many")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	if *subject != "" {
		q.Set("subject", *subject)
	}
	var res json.RawMessage
	if err := c.call(ctx, http.MethodGet, "listAuditLog", q, nil, &res); err != nil {
		return err
	}
	return printJSON(out, res)
}

func (c *adminClient) callPrint(ctx context.Context, nsid string, body any, out io.Writer) error {
	var res json.RawMessage
	if err := c.call(ctx, http.MethodPost, nsid, nil, body, &res); err != nil {
		return err
	}
	return printJSON(out, res)
}

// call performs one XRPC request and decodes the JSON answer into res; an
// XRPC error becomes an error carrying its name and message.
func (c *adminClient) call(ctx context.Context, method, nsid string, q url.Values, body, res any) error {
	u := c.base + "/xrpc/" + AdminNSIDPrefix + nsid
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.SetBasicAuth("admin", c.password)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var xe struct{ Error, Message string }
		if json.Unmarshal(data, &xe) == nil && xe.Error != "" {
			return fmt.Errorf("%s: %s (HTTP %d)", xe.Error, xe.Message, resp.StatusCode)
		}
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	return json.Unmarshal(data, res)
}

func printJSON(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
