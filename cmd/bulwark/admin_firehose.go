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
	return a.repair(ctx, nsid, map[string]any{"seq": *seq, "reason": *reason})
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
	return a.repair(ctx, "emitSync", map[string]any{"did": *did, "reason": *reason})
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
	return a.repair(ctx, "raiseSeq", map[string]any{"floor": *floor, "reason": *reason})
}

func runFirehoseRepairOversized(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error {
	fs := a.flags(cmd)
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	if _, err := a.parse(cmd, fs, args, 0); err != nil {
		return err
	}
	return a.repair(ctx, "repairOversizedEvents", map[string]any{"reason": *reason})
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
	var res json.RawMessage
	if err := c.call(ctx, http.MethodGet, "listConsumers", nil, nil, &res); err != nil {
		return err
	}
	return printJSON(a.stdout, res)
}

// repair calls one firehose repair method and prints its JSON answer.
func (a *adminRun) repair(ctx context.Context, nsid string, body any) error {
	c, err := a.conn()
	if err != nil {
		return err
	}
	var res json.RawMessage
	if err := c.call(ctx, http.MethodPost, nsid, nil, body, &res); err != nil {
		return err
	}
	return printJSON(a.stdout, res)
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
