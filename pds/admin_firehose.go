package pds

import (
	"context"
	"net/http"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/repo"
)

// AdminNSIDPrefix is the namespace of Bulwark's own admin methods (firehose
// inspection and repair, the audit log). The authority io.github.bulwark-pds
// is the project's GitHub organisation, which the project controls. Every
// method needs HTTP Basic admin credentials.
const AdminNSIDPrefix = "io.github.bulwark-pds.admin."

// adminActor names the actor in audit entries of admin-authenticated calls.
const adminActor = "admin"

func (s *Server) registerAdminFirehoseRoutes() {
	s.query(AdminNSIDPrefix+"listEvents", s.admin(s.handleListEvents))
	s.procedure(AdminNSIDPrefix+"rewriteEventAsSync", s.admin(s.handleRewriteEventAsSync))
	s.procedure(AdminNSIDPrefix+"invalidateEvent", s.admin(s.handleInvalidateEvent))
	s.procedure(AdminNSIDPrefix+"emitSync", s.admin(s.handleEmitSync))
	s.procedure(AdminNSIDPrefix+"raiseSeq", s.admin(s.handleRaiseSeq))
	s.procedure(AdminNSIDPrefix+"repairOversizedEvents", s.admin(s.handleRepairOversized))
	s.query(AdminNSIDPrefix+"listAuditLog", s.admin(s.handleListAuditLog))
	s.query(AdminNSIDPrefix+"listConsumers", s.admin(s.handleListConsumers))
}

// admin wraps a handler so it runs only with admin credentials.
func (s *Server) admin(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := s.requireAdmin(r); err != nil {
			return err
		}
		return h(w, r)
	}
}

func (s *Server) handleListEvents(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	f := eventlog.EventFilter{
		FromSeq:    p.intParam("from", 0, 0, 1<<62),
		ToSeq:      p.intParam("to", 0, 0, 1<<62),
		DID:        p.optional("did"),
		Kind:       eventlog.Kind(p.optional("kind")),
		OverLimits: p.boolParam("overLimits", false),
		Limit:      int(p.intParam("limit", 100, 1, 1000)),
	}
	if err := p.Err(); err != nil {
		return err
	}
	switch f.Kind {
	case "", eventlog.KindCommit, eventlog.KindSync, eventlog.KindIdentity, eventlog.KindAccount:
	default:
		return InvalidRequest("kind must be commit, sync, identity or account, not %q", f.Kind)
	}
	evs, err := eventlog.NewLog(s.db).Inspect(r.Context(), f)
	if err != nil {
		return err
	}
	if evs == nil {
		evs = []eventlog.EventInfo{}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"events": evs})
}

type seqRepairInput struct {
	Seq    int64  `json:"seq"`
	Reason string `json:"reason"`
}

func (s *Server) handleRewriteEventAsSync(w http.ResponseWriter, r *http.Request) error {
	return s.seqRepair(w, r, "rewrite", eventlog.NewLog(s.db).RewriteAsSync)
}

func (s *Server) handleInvalidateEvent(w http.ResponseWriter, r *http.Request) error {
	return s.seqRepair(w, r, "invalidate", eventlog.NewLog(s.db).Invalidate)
}

func (s *Server) seqRepair(w http.ResponseWriter, r *http.Request, what string, fn func(ctx context.Context, seq int64, actor, reason string) (*eventlog.RepairResult, error)) error {
	var in seqRepairInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Seq <= 0 {
		return InvalidRequest("seq must be a positive event seq")
	}
	res, err := fn(r.Context(), in.Seq, adminActor, in.Reason)
	if err != nil {
		return err
	}
	s.logger.Warn("firehose repair", "op", what, "seq", in.Seq, "changed", res.Changed, "reason", in.Reason, "request_id", RequestID(r.Context()))
	return writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleEmitSync(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		DID    string `json:"did"`
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	did, err := syntax.ParseDID(in.DID)
	if err != nil {
		return InvalidRequest("did: %v", err)
	}
	rev, err := eventlog.NewLog(s.db).EmitSync(r.Context(), did, repo.SyncEvent, adminActor, in.Reason)
	if err != nil {
		return err
	}
	s.logger.Warn("firehose repair", "op", "emitSync", "did", did, "rev", rev, "reason", in.Reason, "request_id", RequestID(r.Context()))
	return writeJSON(w, http.StatusOK, map[string]any{"did": did, "rev": rev})
}

func (s *Server) handleRaiseSeq(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Floor  int64  `json:"floor"`
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Floor <= 0 {
		return InvalidRequest("floor must be a positive seq")
	}
	before, after, err := eventlog.NewLog(s.db).RaiseSeqAudited(r.Context(), in.Floor, adminActor, in.Reason)
	if err != nil {
		return err
	}
	s.logger.Warn("firehose repair", "op", "raiseSeq", "before", before, "after", after, "reason", in.Reason)
	return writeJSON(w, http.StatusOK, map[string]any{"before": before, "lastSeq": after, "changed": before != after})
}

func (s *Server) handleRepairOversized(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	fixed, err := eventlog.NewLog(s.db).RepairOversized(r.Context(), adminActor, in.Reason)
	if err != nil {
		return err
	}
	if fixed == nil {
		fixed = []eventlog.RepairResult{}
	}
	s.logger.Warn("firehose repair", "op", "repairOversized", "rewritten", len(fixed), "reason", in.Reason)
	return writeJSON(w, http.StatusOK, map[string]any{"repaired": fixed})
}

func (s *Server) handleListAuditLog(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	subject := p.optional("subject")
	before := p.intParam("before", 0, 0, 1<<62)
	limit := int(p.intParam("limit", 50, 1, 500))
	if err := p.Err(); err != nil {
		return err
	}
	entries, err := audit.List(r.Context(), s.db, subject, before, limit)
	if err != nil {
		return err
	}
	if entries == nil {
		entries = []audit.Entry{}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"entries": entries})
}

// handleListConsumers reports the firehose's consumers: recent connections,
// and for a stuck one the event it cannot get past.
func (s *Server) handleListConsumers(w http.ResponseWriter, r *http.Request) error {
	consumers := []firehose.ConsumerReport{}
	if s.firehose != nil && s.firehose.Health() != nil {
		consumers = s.firehose.Health().Consumers()
	}
	stuck := 0
	for _, c := range consumers {
		if c.Stuck != nil {
			stuck++
		}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"consumers": consumers, "stuck": stuck})
}
