package plantest

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/populate"
	"github.com/bulwark-pds/bulwark/plc"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

//go:embed plantest.sql
var plantestSQL string

var fill = db.MustParseQueries(plantestSQL)

// tables classifies every table of the schema: true for one that grows
// with accounts, records or events (a sequential scan of it is a plan that
// gets slower as the server grows), false for one of fixed size.
var tables = map[string]bool{
	"accounts": true, "repo_roots": true, "repo_nodes": true, "records": true, "events": true,
	"blobs": true, "record_blobs": true, "refresh_tokens": true, "app_passwords": true,
	"invite_codes": true, "invite_code_uses": true, "audit_log": true, "takedowns": true,
	"email_tokens": true, "email_outbox": true, "dev_plc_operations": true,
	"oauth_devices": true, "oauth_device_accounts": true, "oauth_requests": true, "oauth_grants": true,
	"oauth_spent_refresh": true, "oauth_used_values": true, "account_preferences": true,
	"service_auth_used": true,

	// A row per node, per singleton job, per shared fact; operator sign-ins.
	"cluster_nodes": false, "cluster_leases": false, "cluster_facts": false, "console_sessions": false,

	"sequencer_state": false, "server_identity": false, "goose_db_version": false,
	"populate_batches": false, "populate_settings": false,
}

// allowedScans are the queries that may scan a growing table, and why.
var allowedScans = map[string]string{
	"CountAccountsByStatus":  "counts every account by status: an administrator's overview",
	"ListInviteCodes":        "an administrator's listing of every invite code, paged",
	"ListInviteCodesByUsage": "an administrator's listing of every invite code ranked by use, paged",
	"CountByState":           "counts the outbox by state for a metrics scrape; sent and failed mail is pruned (PruneMessages), so the outbox stays small",
	"HasAccounts":            "EXISTS over the whole table: stops at the first row",
	"Count":                  "the development PLC directory counts its DIDs (bulwark dev-plc, a development tool)",
	"InviteCodesFor":         "an administrator's view of accounts' invite codes: the join hashes invite_code_uses while it is small, and probes its primary key once it is not",
	"PruneMessages":          "the state is a constant at every call and the cutoff days old: the custom plan walks email_outbox_done, which a generic plan cannot prove applies (a partial index on three states), and Postgres keeps the far cheaper custom plan",
	"CurveTotals":            "bulwark-load curve counts the events once per run (a measuring tool, not the server)",
	"CurveEventsBefore":      "bulwark-load curve counts the events retention pruning will delete, once per run",
	"ClaimMessages":          "a generic plan takes LIMIT $2 for a tenth of the due mail; the worker's batch is a constant, its custom plan probes the primary key, and Postgres keeps that far cheaper plan",
}

// skipped statements cannot be explained: schema changes, session
// settings, and statements of the test and maintenance databases.
func skipped(sql string) bool {
	first := strings.ToUpper(strings.Fields(sql)[0])
	switch first {
	case "CREATE", "DROP", "ALTER", "SET", "LISTEN", "VACUUM", "ANALYZE", "BEGIN", "COMMIT", "ROLLBACK":
		return true
	}
	return strings.Contains(sql, "%s")
}

// namedQuery is one statement of a .sql file.
type namedQuery struct{ file, name, sql string }

// allQueries reads every named query of the module.
func allQueries(t *testing.T) []namedQuery {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	var out []namedQuery
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "migrations" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), "-- name:") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == filepath.Join("db", "plantest", "plantest.sql") {
			return nil
		}
		qs, err := db.ParseQueries(string(b))
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for name, sql := range qs {
			out = append(out, namedQuery{file: rel, name: name, sql: sql})
		}
		return nil
	})
	require.NoError(t, err)
	sort.Slice(out, func(i, j int) bool { return out[i].file+out[i].name < out[j].file+out[j].name })
	require.Greater(t, len(out), 150, "the walk found the module's queries")
	return out
}

// fillRows is how many rows each fill statement adds.
const fillRows = 50_000

func populateDatabase(t *testing.T) string {
	ctx := context.Background()
	url := dbtest.NewURL(t)
	pool, err := db.Open(ctx, url, nil)
	require.NoError(t, err)
	defer pool.Close()
	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	require.NoError(t, err)
	pc, err := plc.NewClient("http://localhost:31999", rotation, nil)
	require.NoError(t, err)
	blobs, err := populate.MakeBlobs(ctx, 1, 16, nil)
	require.NoError(t, err)
	// Small accounts and a few realistic ones: the tables get the row
	// counts and the spread over accounts that plans depend on, in
	// seconds.
	cfg := populate.Config{
		Pool: pool, Keys: keys, PLC: pc, PublicURL: "http://localhost:31999", HandleDomain: ".test",
		Password: "plantest-password", Accounts: 3000, Realistic: 100, Largest: 3000, Seed: 1, Blobs: blobs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	start := time.Now()
	_, err = populate.Run(ctx, cfg)
	require.NoError(t, err)
	t.Logf("populated %d accounts in %s", cfg.Accounts, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	_, err = populate.History(ctx, cfg, 300, 4)
	require.NoError(t, err)
	t.Logf("history in %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	defer func() { t.Logf("filled and analysed in %s", time.Since(start).Round(time.Millisecond)) }()
	conn, err := pool.Acquire(ctx) // some_accounts is the session's
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, fill.MustGet("FillSomeAccounts"))
	require.NoError(t, err)
	for _, name := range []string{"FillInviteCodes", "FillInviteUses", "FillTakedowns", "FillAudit", "FillOAuthRequests",
		"FillOAuthGrants", "FillOAuthSpent", "FillOAuthValues", "FillOAuthDevices", "FillOAuthDeviceAccounts",
		"FillEmailTokens", "FillOutbox", "FillAppPasswords", "FillTempBlobs", "FillServiceAuthUsed"} {
		_, err := conn.Exec(ctx, fill.MustGet(name), fillRows)
		require.NoError(t, err, name)
	}
	_, err = conn.Exec(ctx, fill.MustGet("FillEvents"), 30)
	require.NoError(t, err)
	for _, name := range []string{"FillRaiseSeq", "Analyze"} {
		_, err = conn.Exec(ctx, fill.MustGet(name))
		require.NoError(t, err, name)
	}
	return url
}

// scan is a sequential scan of a growing table in a query's plan.
type scan struct{ query, file, table, plan string }

func (s scan) String() string {
	return fmt.Sprintf("%s (%s) scans %s:\n%s", s.query, s.file, s.table, s.plan)
}

// check explains every query in tx and returns the scans of growing tables
// that allowedScans does not allow, the tables the plans named that tables
// does not classify, and the allowed queries that did scan.
func check(ctx context.Context, t *testing.T, tx pgx.Tx, qs []namedQuery) (bad []scan, unknown, allowedUsed map[string]bool) {
	t.Helper()
	unknown = map[string]bool{}
	allowedUsed = map[string]bool{}
	_, err := tx.Exec(ctx, fill.MustGet("GenericPlans"))
	require.NoError(t, err)
	for i, q := range qs {
		if skipped(q.sql) {
			continue
		}
		plan, err := explain(ctx, tx, fmt.Sprintf("plantest_%d", i), q.sql)
		require.NoError(t, err, "%s (%s)", q.name, q.file)
		for _, table := range seqScans(plan) {
			growing, known := tables[table]
			switch {
			case !known && !strings.HasPrefix(table, "import_") && !strings.HasPrefix(table, "pg_"):
				unknown[table] = true
			case growing && allowedScans[q.name] == "":
				bad = append(bad, scan{q.name, q.file, table, outline(plan, "  ")})
			case growing:
				allowedUsed[q.name] = true
			}
		}
	}
	return bad, unknown, allowedUsed
}

// explain prepares sql as name and returns its generic plan (parameters
// stay parameters).
func explain(ctx context.Context, tx pgx.Tx, name, sql string) (map[string]any, error) {
	if _, err := tx.Exec(ctx, fmt.Sprintf(fill.MustGet("Prepare"), name, sql)); err != nil {
		return nil, err
	}
	var nparams int
	if err := tx.QueryRow(ctx, fill.MustGet("ParamCount"), name).Scan(&nparams); err != nil {
		return nil, err
	}
	args := ""
	if nparams > 0 {
		args = "(" + strings.TrimSuffix(strings.Repeat("NULL,", nparams), ",") + ")"
	}
	var out []map[string]any
	if err := tx.QueryRow(ctx, fmt.Sprintf(fill.MustGet("Explain"), name, args)).Scan(&out); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(fill.MustGet("Deallocate"), name)); err != nil {
		return nil, err
	}
	return out[0]["Plan"].(map[string]any), nil
}

// seqScans lists the relations a plan scans sequentially.
func seqScans(node map[string]any) []string {
	var out []string
	if node["Node Type"] == "Seq Scan" {
		if rel, ok := node["Relation Name"].(string); ok {
			out = append(out, rel)
		}
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				out = append(out, seqScans(m)...)
			}
		}
	}
	return out
}

// outline is a plan's tree of node types, relations and indexes.
func outline(node map[string]any, indent string) string {
	line := indent + fmt.Sprint(node["Node Type"])
	for _, k := range []string{"Relation Name", "Index Name", "Filter", "Index Cond"} {
		if v, ok := node[k]; ok {
			line += fmt.Sprintf(" %s=%v", strings.ToLower(strings.Fields(k)[0]), v)
		}
	}
	line += fmt.Sprintf(" rows=%v\n", node["Plan Rows"])
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				line += outline(m, indent+"  ")
			}
		}
	}
	return line
}

// withSession runs fn in a transaction (always rolled back) in which the
// import's staging tables exist, as they do in an import's session.
func withSession(t *testing.T, pool *pgxpool.Pool, qs []namedQuery, fn func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range qs {
		if q.file == filepath.Join("repo", "import.sql") && strings.HasPrefix(q.name, "ImportCreate") {
			_, err := tx.Exec(ctx, q.sql)
			require.NoError(t, err, q.name)
		}
	}
	fn(ctx, tx)
}

// TestPlans populates one database (a few seconds) for its subtests.
func TestPlans(t *testing.T) {
	pool, err := db.Open(context.Background(), populateDatabase(t), nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	qs := allQueries(t)
	t.Run("NoQueryScansAGrowingTable", func(t *testing.T) { testNoScans(t, pool, qs) })
	t.Run("DroppedIndexIsCaught", func(t *testing.T) { testDroppedIndex(t, pool, qs) })
	t.Run("PagesReadOnePage", func(t *testing.T) { testPaging(t, pool, qs) })
}

// A page from a cursor deep into a walk reads about a page of rows, not
// everything before the cursor: a walk of the whole server stays linear in
// its size. (A merge join of repo_roots with accounts read every account
// before the cursor: 6 s a page half way through a million.)
func testPaging(t *testing.T, pool *pgxpool.Pool, qs []namedQuery) {
	ctx := context.Background()
	const page = 100
	var repo, did, rkey string
	var seq int64
	require.NoError(t, pool.QueryRow(ctx, fill.MustGet("MiddleRepo")).Scan(&repo))
	require.NoError(t, pool.QueryRow(ctx, fill.MustGet("MiddleRecord")).Scan(&did, &rkey))
	require.NoError(t, pool.QueryRow(ctx, fill.MustGet("MiddleSeq")).Scan(&seq))
	for _, c := range []struct {
		name string
		args string
	}{
		{"ListRepos", fmt.Sprintf("('%s', %d)", repo, page)},
		{"ListRecordsAsc", fmt.Sprintf("('%s', 'app.bsky.feed.like', '%s', %d, 4194304)", did, rkey, page)},
		{"ListRecordsDesc", fmt.Sprintf("('%s', 'app.bsky.feed.like', '%s', %d, 4194304)", did, rkey, page)},
		{"ListRecordsNewest", fmt.Sprintf("('%s', 'app.bsky.feed.like', %d, 4194304)", did, page)},
		{"EventsAfterBounded", fmt.Sprintf("(%d, %d, 4194304)", seq, page)},
	} {
		t.Run(c.name, func(t *testing.T) {
			withSession(t, pool, qs, func(ctx context.Context, tx pgx.Tx) {
				_, err := tx.Exec(ctx, fill.MustGet("GenericPlans"))
				require.NoError(t, err)
				q := find(t, qs, c.name)
				name := "paging_" + strings.ToLower(c.name)
				_, err = tx.Exec(ctx, fmt.Sprintf(fill.MustGet("Prepare"), name, q.sql))
				require.NoError(t, err)
				var out []map[string]any
				require.NoError(t, tx.QueryRow(ctx, fmt.Sprintf(fill.MustGet("ExplainAnalyze"), name, c.args)).Scan(&out))
				_, err = tx.Exec(ctx, fmt.Sprintf(fill.MustGet("Deallocate"), name))
				require.NoError(t, err)
				plan := out[0]["Plan"].(map[string]any)
				read := rowsScanned(plan)
				require.LessOrEqual(t, read, 3*page+10, "rows read for a page of %d:\n%s", page, outline(plan, "  "))
			})
		})
	}
}

// find returns the named query.
func find(t *testing.T, qs []namedQuery, name string) namedQuery {
	t.Helper()
	for _, q := range qs {
		if q.name == name {
			return q
		}
	}
	t.Fatalf("no query named %s", name)
	return namedQuery{}
}

// rowsScanned sums the rows every scan node of an analysed plan produced,
// over all its loops.
func rowsScanned(node map[string]any) int {
	n := 0
	if typ, _ := node["Node Type"].(string); strings.HasSuffix(typ, "Scan") && typ != "CTE Scan" && typ != "Subquery Scan" && typ != "Function Scan" {
		rows, _ := node["Actual Rows"].(float64)
		loops, _ := node["Actual Loops"].(float64)
		n += int(rows * loops)
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				n += rowsScanned(m)
			}
		}
	}
	return n
}

// No named query scans a table that grows with the server.
func testNoScans(t *testing.T, pool *pgxpool.Pool, qs []namedQuery) {
	withSession(t, pool, qs, func(ctx context.Context, tx pgx.Tx) {
		bad, unknown, allowedUsed := check(ctx, t, tx, qs)
		require.Empty(t, unknown, "tables not classified in tables (plan_test.go): growing with the server or not?")
		for name := range allowedScans {
			if !allowedUsed[name] {
				// Not an error: some plans flip between an index-only
				// scan and a scan with the visibility map's state.
				t.Logf("allowedScans lists %s, whose plan does not scan a growing table now", name)
			}
		}
		for _, b := range bad {
			t.Errorf("%s", b)
		}
		if len(bad) > 0 {
			t.Errorf("%d queries' plans scan a growing table: add the index they need, or list them in allowedScans with the reason", len(bad))
		}
	})
}

// The test fails when an index a query relies on is dropped: dropping each
// of these (in a transaction rolled back) makes the named query's plan
// scan the table.
func testDroppedIndex(t *testing.T, pool *pgxpool.Pool, qs []namedQuery) {
	for _, c := range []struct{ drop, query string }{
		{"ALTER TABLE events DROP CONSTRAINT IF EXISTS events_seq_key; DROP INDEX events_seq_created", "EventsAfterBounded"},
		{"DROP INDEX accounts_created", "SampleAccounts"},
		{"DROP INDEX invite_code_uses_used_by", "InviteUsedBy"},
		{"ALTER TABLE accounts DROP CONSTRAINT accounts_handle_key", "GetAccountByHandle"},
		{"DROP INDEX email_tokens_code", "LockTokenByCode"},
	} {
		t.Run(c.query, func(t *testing.T) {
			withSession(t, pool, qs, func(ctx context.Context, tx pgx.Tx) {
				for _, stmt := range strings.Split(c.drop, ";") {
					_, err := tx.Exec(ctx, stmt)
					require.NoError(t, err)
				}
				bad, _, _ := check(ctx, t, tx, qs)
				var names []string
				for _, b := range bad {
					names = append(names, b.query)
				}
				require.Contains(t, names, c.query, "after %s", c.drop)
			})
		})
	}
}
