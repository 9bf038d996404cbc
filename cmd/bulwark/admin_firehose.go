package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bulwark-pds/bulwark/firehose"
)

// firehoseCommands inspect and repair the firehose's event log
// (io.github.bulwark-pds.admin.*).
var firehoseCommands = []*adminCommand{
	{path: "firehose events", args: "[--from SEQ] [--to SEQ] [--did DID] [--kind K] [--over-limits] [--limit N]",
		summary: "list stored events with their sizes and any protocol limit they break", run: runFirehoseEvents},
	{path: "firehose rewrite-as-sync", args: "--seq SEQ [--reason TEXT]",
		summary: "serve one stored event as a #sync of its repository from now on", run: runFirehoseSeqRepair},
	{path: "firehose invalidate", args: "--seq SEQ [--reason TEXT]",
		summary: "stop serving one stored event", run: runFirehoseSeqRepair},
	{path: "firehose emit-sync", args: "--did DID [--reason TEXT]",
		summary: "emit a fresh #sync event for a repository", run: runFirehoseEmitSync},
	{path: "firehose raise-seq", args: "--floor SEQ [--reason TEXT]",
		summary: "make the next event's seq at least SEQ (after restoring an old backup)", run: runFirehoseRaiseSeq},
	{path: "firehose repair-oversized", args: "[--reason TEXT]",
		summary: "rewrite every stored event over a protocol limit as #sync", run: runFirehoseRepairOversized},
	{path: "firehose consumers", args: "",
		summary: "recent subscribeRepos consumers, and the event a stuck one cannot get past", run: runFirehoseConsumers},
}

// auditCommands read the audit log.
var auditCommands = []*adminCommand{
	{path: "audit", args: "[--subject S] [--limit N]",
		summary: "recent audit log entries, newest first (subject: a DID, seq:N, ...)", run: runAudit},
}

type firehoseEvent struct {
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
}

func runFirehoseEvents(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	from := fs.Int64("from", 0, "first seq")
	to := fs.Int64("to", 0, "last seq (0: no bound)")
	did := fs.String("did", "", "only this repository's events")
	kind := fs.String("kind", "", "only commit, sync, identity or account events")
	over := fs.Bool("over-limits", false, "only events that break a protocol limit")
	limit := fs.Int("limit", 100, "how many (at most 1000)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
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
		Events []firehoseEvent `json:"events"`
	}
	if err := c.call(ctx, http.MethodGet, "listEvents", q, nil, &res); err != nil {
		return err
	}
	return a.output(res, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
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
	})
}

func runFirehoseSeqRepair(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	seq := fs.Int64("seq", 0, "the event's seq")
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	if *seq <= 0 {
		return usageError(cmd.path + " needs --seq")
	}
	nsid := map[string]string{"firehose rewrite-as-sync": "rewriteEventAsSync", "firehose invalidate": "invalidateEvent"}[cmd.path]
	return a.repairJSON(ctx, nsid, map[string]any{"seq": *seq, "reason": *reason})
}

func runFirehoseEmitSync(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	did := fs.String("did", "", "the repository's DID")
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	if *did == "" {
		return usageError("emit-sync needs --did")
	}
	var res struct {
		DID string `json:"did"`
		Rev string `json:"rev"`
	}
	if err := a.repair(ctx, "emitSync", map[string]any{"did": *did, "reason": *reason}, &res); err != nil {
		return err
	}
	return a.output(res, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "emitted a #sync of %s at rev %s (it gets its seq once sequenced: firehose events --did %s)\n", res.DID, res.Rev, res.DID)
		return err
	})
}

func runFirehoseRaiseSeq(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	floor := fs.Int64("floor", 0, "the least seq the next event gets")
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	if *floor <= 0 {
		return usageError("raise-seq needs --floor")
	}
	var res struct {
		Before  int64 `json:"before"`
		LastSeq int64 `json:"lastSeq"`
		Changed bool  `json:"changed"`
	}
	if err := a.repair(ctx, "raiseSeq", map[string]any{"floor": *floor, "reason": *reason}, &res); err != nil {
		return err
	}
	return a.output(res, func(w io.Writer) error {
		var err error
		if res.Changed {
			_, err = fmt.Fprintf(w, "last seq raised from %d to %d: the next event gets %d or more\n", res.Before, res.LastSeq, res.LastSeq+1)
		} else {
			_, err = fmt.Fprintf(w, "last seq unchanged at %d, already at least %d\n", res.LastSeq, *floor)
		}
		return err
	})
}

func runFirehoseRepairOversized(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	return a.repairJSON(ctx, "repairOversizedEvents", map[string]any{"reason": *reason})
}

func runFirehoseConsumers(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	var res consumersOutput
	if err := c.call(ctx, http.MethodGet, "listConsumers", nil, nil, &res); err != nil {
		return err
	}
	return a.output(res, res.print)
}

// consumersOutput is listConsumers' answer.
type consumersOutput struct {
	Consumers []firehose.ConsumerReport `json:"consumers"`
	Stuck     int                       `json:"stuck"`
}

func (res consumersOutput) print(w io.Writer) error {
	if len(res.Consumers) == 0 {
		_, err := fmt.Fprintln(w, "no subscribeRepos consumer seen since the server started")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tUSER-AGENT\tACTIVE\tCONNECTIONS\tREFUSED\tLAST SEEN\tSTATE")
	var stuck []int64
	for _, c := range res.Consumers {
		state := "ok"
		if s := c.Stuck; s != nil {
			state = fmt.Sprintf("STUCK at seq %d (cursor %d, %d reconnects since %s)", s.Seq, s.Cursor, s.Reconnects, s.Since.UTC().Format(time.RFC3339))
			stuck = append(stuck, s.Seq)
		} else if f := c.FutureCursor; f != nil {
			state = fmt.Sprintf("AHEAD: cursor %d beyond our newest seq %d (%d refusals); if our sequence went back (a restored backup): %s", f.Cursor, f.Head, f.Refusals, f.Command)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", c.IP, orDash(c.UserAgent), c.Active, c.Connections, c.Refused, c.LastSeen.UTC().Format(time.RFC3339), state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, seq := range stuck {
		if _, err := fmt.Fprintf(w, "a consumer cannot get past event %d: see bulwark admin firehose events --from %d --limit 1; bulwark admin firehose rewrite-as-sync --seq %d repairs it\n", seq, seq, seq); err != nil {
			return err
		}
	}
	return nil
}

// repairJSON calls one firehose repair method and prints its answer as
// JSON, the record of what changed (before and after) that scripts read.
func (a *adminRun) repairJSON(ctx context.Context, nsid string, body any) error {
	var res json.RawMessage
	if err := a.repair(ctx, nsid, body, &res); err != nil {
		return err
	}
	return printJSON(a.stdout, res)
}

// repair calls one firehose repair method, decoding its answer into res.
func (a *adminRun) repair(ctx context.Context, nsid string, body, res any) error {
	c, err := a.conn()
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, nsid, nil, body, res)
}

type auditEntry struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Actor   string          `json:"actor"`
	Action  string          `json:"action"`
	Subject string          `json:"subject"`
	Before  json.RawMessage `json:"before,omitempty"`
	After   json.RawMessage `json:"after,omitempty"`
	Reason  string          `json:"reason,omitempty"`
}

// auditChange shows an entry's change as "before → after", or the state
// after alone when there was nothing before.
func auditChange(before, after json.RawMessage) string {
	switch {
	case len(before) > 0 && len(after) > 0:
		return string(before) + " → " + string(after)
	case len(before) > 0:
		return string(before) + " → (none)"
	}
	return string(after)
}

func runAudit(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	subject := fs.String("subject", "", "only entries about this subject (a DID, seq:N, ...)")
	limit := fs.Int("limit", 50, "how many (at most 500)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	c, err := a.conn()
	if err != nil {
		return err
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	if *subject != "" {
		q.Set("subject", *subject)
	}
	var res struct {
		Entries []auditEntry `json:"entries"`
	}
	if err := c.call(ctx, http.MethodGet, "listAuditLog", q, nil, &res); err != nil {
		return err
	}
	return a.output(res, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tACTION\tSUBJECT\tACTOR\tCHANGE\tREASON")
		for _, e := range res.Entries {
			change := auditChange(e.Before, e.After)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Action, e.Subject, e.Actor, change, e.Reason)
		}
		return tw.Flush()
	})
}
