package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/fastsyntax"
	"github.com/bulwark-pds/bulwark/limits"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// registerRepoRoutes registers com.atproto.repo's record methods. They need
// the repository engine and accounts.
func (s *Server) registerRepoRoutes() {
	if s.repo == nil || s.accounts == nil {
		return
	}
	// Load the embedded schemas now, not on the first write; a schema that
	// does not load is a build error, found at start-up.
	if _, err := lexicons(); err != nil {
		panic(err)
	}
	s.procedure("com.atproto.repo.createRecord", s.handleCreateRecord)
	s.procedure("com.atproto.repo.putRecord", s.handlePutRecord)
	s.procedure("com.atproto.repo.deleteRecord", s.handleDeleteRecord)
	s.procedure("com.atproto.repo.applyWrites", s.handleApplyWrites)
	s.query("com.atproto.repo.getRecord", s.handleGetRecord)
	s.query("com.atproto.repo.listRecords", s.handleListRecords)
	s.query("com.atproto.repo.describeRepo", s.handleDescribeRepo)
}

// commitMeta is com.atproto.repo.defs#commitMeta.
type commitMeta struct {
	CID string `json:"cid"`
	Rev string `json:"rev"`
}

// optionalCID parses an optional CID field ("" is absent).
func optionalCID(name, raw string) (*cid.Cid, error) {
	if raw == "" {
		return nil, nil
	}
	c, err := cid.Decode(raw)
	if err != nil {
		return nil, InvalidRequest("%s: %q is not a CID", name, raw)
	}
	return &c, nil
}

// swapRecordField parses a swapRecord that may be absent (no condition),
// null (the record must not exist) or a CID.
func swapRecordField(raw json.RawMessage) (*repo.Swap, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return &repo.Swap{}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, InvalidRequest("swapRecord must be a CID string or null")
	}
	c, err := optionalCID("swapRecord", s)
	if err != nil || c == nil {
		return nil, InvalidRequest("swapRecord: %q is not a CID", s)
	}
	return &repo.Swap{CID: c}, nil
}

func parseCollection(raw string) (syntax.NSID, error) {
	n, err := fastsyntax.ParseNSID(raw)
	if err != nil {
		return "", InvalidRequest("collection %q is not an NSID: %v", raw, err)
	}
	return n, nil
}

func parseRKey(raw string) (syntax.RecordKey, error) {
	k, err := fastsyntax.ParseRecordKey(raw)
	if err != nil {
		return "", InvalidRequest("rkey %q is not a valid record key: %v", raw, err)
	}
	return k, nil
}

// parseRecord parses a record's JSON with the atproto data model's rules
// (no floats, well-formed $link/$bytes/blob objects) and checks its $type
// and lexicon. It returns the record and its validationStatus.
func parseRecord(collection syntax.NSID, raw json.RawMessage, validate *bool) (map[string]any, string, error) {
	if len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, "", InvalidRequest("record is required")
	}
	rec, err := atdata.UnmarshalJSON(raw)
	if err != nil {
		return nil, "", InvalidRequest("record is not valid atproto data: %v", err)
	}
	if t, ok := rec["$type"]; !ok {
		// Clients may leave $type out; it can only be the collection.
		rec["$type"] = collection.String()
	} else if ts, _ := t.(string); ts != collection.String() {
		return nil, "", InvalidRequest("record $type %q does not match collection %q", t, collection)
	}
	status, err := validateRecord(collection, rec, validate)
	if err != nil {
		return nil, "", err
	}
	return rec, status, nil
}

func atURI(did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) string {
	return "at://" + did.String() + "/" + collection.String() + "/" + rkey.String()
}

type createRecordInput struct {
	Repo       string          `json:"repo"`
	Collection string          `json:"collection"`
	RKey       string          `json:"rkey"`
	Validate   *bool           `json:"validate"`
	Record     json.RawMessage `json:"record"`
	SwapCommit string          `json:"swapCommit"`
}

type writeOutput struct {
	URI              string      `json:"uri"`
	CID              string      `json:"cid"`
	Commit           *commitMeta `json:"commit,omitempty"`
	ValidationStatus string      `json:"validationStatus,omitempty"`
}

// recordWrite is the parsed, authorised target of a one-record write
// (createRecord, putRecord, deleteRecord).
// commit applies writes as auth's commit. A commit refused by the session
// guard is answered with the error the full session check gives.
// An OAuth session's grant must cover every write (checkRepoScope).
func (s *Server) commit(w http.ResponseWriter, r *http.Request, auth *writeAuth, writes []repo.Write, swapCommit *cid.Cid) (*repo.CommitResult, error) {
	if err := checkRepoScope(auth.Auth, writes); err != nil {
		return nil, err
	}
	res, err := s.applyGuarded(w, r, auth.DID, writes, swapCommit, auth.guard)
	if err != nil && auth.guard != nil && account.IsSessionRefused(err) {
		if _, aerr := s.requireAuth(r); aerr != nil {
			return nil, aerr
		}
		// The session came back between the commit and the check (it
		// cannot, but say something true if it does).
		return nil, tokenInvalid("the session could not be confirmed; try again")
	}
	return res, err
}

// foreground marks a write in flight ("writes first", package priority)
// until the returned function is called: background streams (getRepo
// exports, blob downloads, firehose backfill) pause meanwhile. Write
// handlers enter it once the request body has been read and the caller
// authorised, and leave once they have answered, so the record's
// validation, the commit and the answer all go first, while a client
// trickling its request body holds nothing back.
func (s *Server) foreground() (leave func()) { return s.priority.Enter() }

// applyGuarded is repo.Engine.ApplyGuarded for the write handlers: it
// charges the account's write points first (429 before any database work)
// and counts the commit once it is durable.
func (s *Server) applyGuarded(w http.ResponseWriter, r *http.Request, did syntax.DID, writes []repo.Write, swapCommit *cid.Cid, guard *repo.Guard) (*repo.CommitResult, error) {
	if err := s.rateLimit(w, ratelimit.PolicyRepoWrite, did.String(), writePoints(writes)); err != nil {
		return nil, err
	}
	res, err := s.repo.ApplyGuarded(r.Context(), did, writes, swapCommit, guard)
	if err == nil {
		metrics.Commits.Inc()
	}
	return res, err
}

type recordWrite struct {
	auth       *writeAuth
	collection syntax.NSID
	rkey       syntax.RecordKey // empty: createRecord without rkey
	swapCommit *cid.Cid
	swapRecord *repo.Swap
}

// parseRecordWrite authorises the caller on repoID and parses the fields the
// one-record writes share. rkey may be empty only when optional.
func (s *Server) parseRecordWrite(r *http.Request, repoID, collection, rkey string, rkeyOptional bool, swapCommit string, swapRecord json.RawMessage) (*recordWrite, error) {
	auth, err := s.requireRepoWrite(r, repoID)
	if err != nil {
		return nil, err
	}
	out := &recordWrite{auth: auth}
	if out.collection, err = parseCollection(collection); err != nil {
		return nil, err
	}
	if rkey != "" || !rkeyOptional {
		if out.rkey, err = parseRKey(rkey); err != nil {
			return nil, err
		}
	}
	if out.swapCommit, err = optionalCID("swapCommit", swapCommit); err != nil {
		return nil, err
	}
	if out.swapRecord, err = swapRecordField(swapRecord); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Server) handleCreateRecord(w http.ResponseWriter, r *http.Request) error {
	var in createRecordInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	t, err := s.parseRecordWrite(r, in.Repo, in.Collection, in.RKey, true, in.SwapCommit, nil)
	if err != nil {
		return err
	}
	defer s.foreground()()
	rec, status, err := parseRecord(t.collection, in.Record, in.Validate)
	if err != nil {
		return err
	}
	res, err := s.commit(w, r, t.auth, []repo.Write{{
		Action: repo.ActionCreate, Collection: t.collection, RKey: t.rkey, Record: rec,
	}}, t.swapCommit)
	if err != nil {
		return err
	}
	wr := res.Results[0]
	return writeJSON(w, http.StatusOK, writeOutput{
		URI: atURI(t.auth.DID, t.collection, wr.RKey), CID: wr.CID.String(),
		Commit: &commitMeta{CID: res.Commit.String(), Rev: res.Rev}, ValidationStatus: status,
	})
}

type putRecordInput struct {
	Repo       string          `json:"repo"`
	Collection string          `json:"collection"`
	RKey       string          `json:"rkey"`
	Validate   *bool           `json:"validate"`
	Record     json.RawMessage `json:"record"`
	SwapRecord json.RawMessage `json:"swapRecord"`
	SwapCommit string          `json:"swapCommit"`
}

func (s *Server) handlePutRecord(w http.ResponseWriter, r *http.Request) error {
	var in putRecordInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	t, err := s.parseRecordWrite(r, in.Repo, in.Collection, in.RKey, false, in.SwapCommit, in.SwapRecord)
	if err != nil {
		return err
	}
	defer s.foreground()()
	rec, status, err := parseRecord(t.collection, in.Record, in.Validate)
	if err != nil {
		return err
	}
	writes := []repo.Write{{
		Action: repo.ActionUpdate, Collection: t.collection, RKey: t.rkey, Record: rec, SwapRecord: t.swapRecord,
	}}
	// putRecord creates the record when it is not there yet.
	if err := checkRepoScope(t.auth.Auth, writes, string(repo.ActionCreate)); err != nil {
		return err
	}
	res, err := s.commit(w, r, t.auth, writes, t.swapCommit)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, writeOutput{
		URI: atURI(t.auth.DID, t.collection, t.rkey), CID: res.Results[0].CID.String(),
		Commit: &commitMeta{CID: res.Commit.String(), Rev: res.Rev}, ValidationStatus: status,
	})
}

type deleteRecordInput struct {
	Repo       string          `json:"repo"`
	Collection string          `json:"collection"`
	RKey       string          `json:"rkey"`
	SwapRecord json.RawMessage `json:"swapRecord"`
	SwapCommit string          `json:"swapCommit"`
}

type deleteRecordOutput struct {
	Commit *commitMeta `json:"commit,omitempty"`
}

func (s *Server) handleDeleteRecord(w http.ResponseWriter, r *http.Request) error {
	var in deleteRecordInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	t, err := s.parseRecordWrite(r, in.Repo, in.Collection, in.RKey, false, in.SwapCommit, in.SwapRecord)
	if err != nil {
		return err
	}
	defer s.foreground()()
	res, err := s.commit(w, r, t.auth, []repo.Write{{
		Action: repo.ActionDelete, Collection: t.collection, RKey: t.rkey, SwapRecord: t.swapRecord,
	}}, t.swapCommit)
	if errors.Is(err, repo.ErrRecordNotFound) && t.swapRecord == nil {
		// Deleting what is not there is a no-op, as in the reference PDS.
		return writeJSON(w, http.StatusOK, deleteRecordOutput{})
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, deleteRecordOutput{Commit: &commitMeta{CID: res.Commit.String(), Rev: res.Rev}})
}

// applyWrite is one element of applyWrites' writes union.
type applyWrite struct {
	Type       string          `json:"$type"`
	Collection string          `json:"collection"`
	RKey       string          `json:"rkey"`
	Value      json.RawMessage `json:"value"`
}

type applyWritesInput struct {
	Repo       string       `json:"repo"`
	Validate   *bool        `json:"validate"`
	Writes     []applyWrite `json:"writes"`
	SwapCommit string       `json:"swapCommit"`
}

type applyWriteResult struct {
	Type             string `json:"$type"`
	URI              string `json:"uri,omitempty"`
	CID              string `json:"cid,omitempty"`
	ValidationStatus string `json:"validationStatus,omitempty"`
}

type applyWritesOutput struct {
	Commit  *commitMeta        `json:"commit,omitempty"`
	Results []applyWriteResult `json:"results"`
}

const applyWritesNS = "com.atproto.repo.applyWrites#"

func (s *Server) handleApplyWrites(w http.ResponseWriter, r *http.Request) error {
	var in applyWritesInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	auth, err := s.requireRepoWrite(r, in.Repo)
	if err != nil {
		return err
	}
	defer s.foreground()()
	if len(in.Writes) > limits.MaxCommitOps {
		return InvalidRequest("too many writes: %d; the limit is %d per request", len(in.Writes), limits.MaxCommitOps)
	}
	if len(in.Writes) == 0 {
		return InvalidRequest("writes must hold at least one write")
	}
	swapCommit, err := optionalCID("swapCommit", in.SwapCommit)
	if err != nil {
		return err
	}
	writes := make([]repo.Write, len(in.Writes))
	statuses := make([]string, len(in.Writes))
	for i, aw := range in.Writes {
		collection, err := parseCollection(aw.Collection)
		if err != nil {
			return err
		}
		wr := repo.Write{Collection: collection}
		if aw.RKey != "" {
			if wr.RKey, err = parseRKey(aw.RKey); err != nil {
				return err
			}
		}
		switch strings.TrimPrefix(aw.Type, applyWritesNS) {
		case "create":
			wr.Action = repo.ActionCreate
		case "update":
			wr.Action = repo.ActionUpdate
		case "delete":
			wr.Action = repo.ActionDelete
		default:
			return InvalidRequest("writes[%d]: $type must be %screate, update or delete, not %q", i, applyWritesNS, aw.Type)
		}
		if wr.Action != repo.ActionCreate && wr.RKey == "" {
			return InvalidRequest("writes[%d]: %s needs an rkey", i, wr.Action)
		}
		if wr.Action != repo.ActionDelete {
			if wr.Record, statuses[i], err = parseRecord(collection, aw.Value, in.Validate); err != nil {
				var xe *XRPCError
				if errors.As(err, &xe) {
					xe.Message = "writes[" + itoa(i) + "]: " + xe.Message
				}
				return err
			}
		}
		writes[i] = wr
	}
	res, err := s.commit(w, r, auth, writes, swapCommit)
	if err != nil {
		return err
	}
	out := applyWritesOutput{Commit: &commitMeta{CID: res.Commit.String(), Rev: res.Rev}, Results: make([]applyWriteResult, len(res.Results))}
	for i, wr := range res.Results {
		ar := applyWriteResult{Type: applyWritesNS + string(writes[i].Action) + "Result"}
		if writes[i].Action != repo.ActionDelete {
			ar.URI = atURI(auth.DID, wr.Collection, wr.RKey)
			ar.CID = wr.CID.String()
			ar.ValidationStatus = statuses[i]
		}
		out.Results[i] = ar
	}
	return writeJSON(w, http.StatusOK, out)
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// resolveRepo turns a repo parameter (DID or handle) into a hosted
// account. Unknown repos are RepoNotFound; deactivated or taken-down ones
// answer RepoDeactivated / RepoTakendown, as sync methods do.
func (s *Server) resolveRepo(ctx context.Context, raw string) (*account.Account, error) {
	id, err := syntax.ParseAtIdentifier(raw)
	if err != nil {
		return nil, InvalidRequest("repo %q is not a DID or handle", raw)
	}
	var a *account.Account
	if id.IsDID() {
		d, _ := id.AsDID()
		a, err = s.accounts.Get(ctx, d)
	} else {
		h, _ := id.AsHandle()
		a, err = s.accounts.GetByHandle(ctx, h)
	}
	if errors.Is(err, account.ErrAccountNotFound) {
		return nil, RepoNotFound("could not find repo: %s", raw)
	}
	if err != nil {
		return nil, err
	}
	switch a.Status {
	case account.StatusDeactivated:
		return nil, newError(http.StatusBadRequest, "RepoDeactivated", "repo %s is deactivated", a.DID)
	case account.StatusTakendown:
		return nil, newError(http.StatusBadRequest, "RepoTakendown", "repo %s has been taken down", a.DID)
	}
	return a, nil
}

type recordOutput struct {
	URI   string         `json:"uri"`
	CID   string         `json:"cid"`
	Value map[string]any `json:"value"`
}

func recordJSON(did syntax.DID, rec *repo.Record) (recordOutput, error) {
	v, err := atdata.UnmarshalCBOR(rec.Data)
	if err != nil {
		return recordOutput{}, err
	}
	emptyBytes(v) // v is a map: changed in place
	return recordOutput{URI: atURI(did, rec.Collection, rec.RKey), CID: rec.CID.String(), Value: v}, nil
}

// emptyBytes returns v with every nil atdata.Bytes in it (what a
// zero-length CBOR byte string decodes to) made empty, changing maps and
// slices in place: atdata.Bytes refuses to encode nil as JSON, and
// {"$bytes": ""} is valid data any client may write, so one such record
// would otherwise make its getRecord and every listRecords page holding
// it a 500.
func emptyBytes(v any) any {
	switch x := v.(type) {
	case atdata.Bytes:
		if x == nil {
			return atdata.Bytes{}
		}
	case map[string]any:
		for k, e := range x {
			x[k] = emptyBytes(e)
		}
	case []any:
		for i, e := range x {
			x[i] = emptyBytes(e)
		}
	}
	return v
}

func (s *Server) handleGetRecord(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	repoID := p.required("repo")
	coll := p.required("collection")
	rk := p.required("rkey")
	wantCID := p.optional("cid")
	if err := p.Err(); err != nil {
		return err
	}
	collection, err := parseCollection(coll)
	if err != nil {
		return err
	}
	rkey, err := parseRKey(rk)
	if err != nil {
		return err
	}
	a, err := s.resolveRepo(r.Context(), repoID)
	if err != nil {
		return err
	}
	if err := s.recordServable(r.Context(), a.DID, collection, rkey); err != nil {
		return err
	}
	rec, err := s.repo.GetRecord(r.Context(), a.DID, collection, rkey)
	if err != nil {
		return err
	}
	release, err := s.guardRecord(r.Context(), len(rec.Data))
	if err != nil {
		return err
	}
	defer release()
	if wantCID != "" && rec.CID.String() != wantCID {
		return RecordNotFound("could not locate record: %s with cid %s", atURI(a.DID, collection, rkey), wantCID)
	}
	out, err := recordJSON(a.DID, rec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

type describeRepoOutput struct {
	Handle          string   `json:"handle"`
	DID             string   `json:"did"`
	DIDDoc          any      `json:"didDoc"`
	Collections     []string `json:"collections"`
	HandleIsCorrect bool     `json:"handleIsCorrect"`
}

func (s *Server) handleDescribeRepo(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	repoID := p.required("repo")
	if err := p.Err(); err != nil {
		return err
	}
	a, err := s.resolveRepo(r.Context(), repoID)
	if err != nil {
		return err
	}
	colls, err := s.repo.ListCollections(r.Context(), a.DID)
	if err != nil {
		return err
	}
	if colls == nil {
		colls = []string{}
	}
	doc, err := s.didDoc(r.Context(), a)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, describeRepoOutput{
		Handle: a.Handle.String(), DID: a.DID.String(), DIDDoc: doc, Collections: colls, HandleIsCorrect: true,
	})
}

// didDocument is the DID document as this server publishes it.
type didDocument struct {
	Context            []string             `json:"@context"`
	ID                 string               `json:"id"`
	AlsoKnownAs        []string             `json:"alsoKnownAs"`
	VerificationMethod []verificationMethod `json:"verificationMethod"`
	Service            []didService         `json:"service"`
}

type verificationMethod struct {
	ID                 string `json:"id"`
	Type               string `json:"type"`
	Controller         string `json:"controller"`
	PublicKeyMultibase string `json:"publicKeyMultibase"`
}

type didService struct {
	ID              string `json:"id"`
	Type            string `json:"type"`
	ServiceEndpoint string `json:"serviceEndpoint"`
}

// didDoc builds a hosted account's DID document from what this server
// wrote into the PLC directory, without asking it: describeRepo and
// session responses must not depend on a network round trip.
func (s *Server) didDoc(ctx context.Context, a *account.Account) (*didDocument, error) {
	pub, err := s.accounts.PublicKey(ctx, a.DID)
	if err != nil {
		return nil, err
	}
	return newDIDDocument(a.DID, a.Handle, pub, s.cfg.PublicURL()), nil
}

func newDIDDocument(did syntax.DID, handle syntax.Handle, pub atcrypto.PublicKey, pdsURL string) *didDocument {
	d := did.String()
	return &didDocument{
		Context:     []string{"https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1", "https://w3id.org/security/suites/secp256k1-2019/v1"},
		ID:          d,
		AlsoKnownAs: []string{"at://" + handle.String()},
		VerificationMethod: []verificationMethod{{
			ID: d + "#" + plc.VerificationMethod, Type: "Multikey", Controller: d, PublicKeyMultibase: pub.Multibase(),
		}},
		Service: []didService{{ID: "#" + plc.ServiceID, Type: plc.ServiceType, ServiceEndpoint: pdsURL}},
	}
}
