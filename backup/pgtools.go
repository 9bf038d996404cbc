package backup

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var querySQL string

var queries = db.MustParseQueries(querySQL)

var (
	qServerVersionNum  = queries.MustGet("ServerVersionNum")
	qUserRelationCount = queries.MustGet("UserRelationCount")
)

// maxToolOutput bounds the stderr of pg_dump or pg_restore kept for an
// error message.
const maxToolOutput = 64 << 10

// pgTool is a Postgres client program and its major version.
type pgTool struct {
	path  string
	major int
}

// findTool picks the program name (pg_dump, pg_restore) to use with a
// server of major version atLeast: in binDir if given, else the oldest
// release not older than atLeast among the places the server programs are
// found, since a client refuses (pg_dump) or may fail on (pg_restore) a
// server newer than itself, and the closest release speaks the server's
// dialect best.
func findTool(ctx context.Context, name, binDir string, atLeast int) (pgTool, error) {
	var dirs []string
	if binDir != "" {
		dirs = []string{binDir}
	} else {
		dirs = candidateDirs(ctx, name)
	}
	var found []pgTool
	seen := map[string]bool{}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if seen[p] {
			continue
		}
		seen[p] = true
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			continue
		}
		major, err := toolMajor(ctx, p)
		if err != nil {
			continue
		}
		found = append(found, pgTool{path: p, major: major})
	}
	// Stable: among equal versions the earlier place (PATH) wins.
	slices.SortStableFunc(found, func(a, b pgTool) int { return a.major - b.major })
	for _, t := range found {
		if t.major >= atLeast {
			return t, nil
		}
	}
	where := "PATH, pg_config --bindir, /usr/lib/postgresql/*/bin or /usr/pgsql-*/bin"
	if binDir != "" {
		where = binDir
	}
	var have []string
	for _, t := range found {
		have = append(have, fmt.Sprintf("%d (%s)", t.major, t.path))
	}
	if len(have) == 0 {
		have = []string{"none"}
	}
	return pgTool{}, fmt.Errorf("backup: no %s of PostgreSQL %d or newer in %s (found: %s): install the client programs (Debian: apt-get install postgresql-client-%d) or pass --pg-bin-dir",
		name, atLeast, where, strings.Join(have, ", "), atLeast)
}

// candidateDirs are where the managed cluster's programs are looked for
// (package db), which is where their client programs are installed too.
func candidateDirs(ctx context.Context, name string) []string {
	var dirs []string
	if p, err := exec.LookPath(name); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	return dirs
}

// toolMajor runs `path --version` ("pg_dump (PostgreSQL) 15.18 (Debian
// 15.18-0+deb12u1)") and returns the major version.
func toolMajor(ctx context.Context, path string) (int, error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return 0, err
	}
	return parseMajor(string(out))
}

// parseMajor reads the major version from a --version line: 15 for
// "15.18", 9 for "9.6.24", 17 for "17devel".
func parseMajor(line string) (int, error) {
	fields := strings.Fields(line)
	if len(fields) < 3 {
		return 0, fmt.Errorf("backup: unexpected version output %q", line)
	}
	v := fields[2]
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		v = v[:i]
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("backup: unexpected version output %q", line)
	}
	return n, nil
}

// serverMajor connects to url and returns the server's major version and
// how many relations it holds outside the system schemas.
func serverMajor(ctx context.Context, url string) (major int, relations int64, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, 0, fmt.Errorf("backup: connect to %s: %w", db.RedactURL(url), err)
	}
	defer conn.Close(context.Background())
	var num int
	if err := conn.QueryRow(ctx, qServerVersionNum).Scan(&num); err != nil {
		return 0, 0, fmt.Errorf("backup: server version: %w", db.Translate(err))
	}
	if err := conn.QueryRow(ctx, qUserRelationCount).Scan(&relations); err != nil {
		return 0, 0, fmt.Errorf("backup: count relations: %w", db.Translate(err))
	}
	// 150018 is 15.18; 90624 was 9.6.24.
	return num / 10000, relations, nil
}

// pgxOnlyParams are connection URL parameters pgx understands and libpq
// refuses; they are dropped before the URL goes to pg_dump or pg_restore.
var pgxOnlyParams = []string{
	"default_query_exec_mode", "statement_cache_capacity", "description_cache_capacity",
	"prefer_simple_protocol", "min_read_buffer_size",
}

// libpqConn turns a pgx connection URL into what libpq programs take: the
// URL without its password and without pgx's own parameters, and the
// password apart, for PGPASSWORD, so that it is not in the command line
// other users can read. A keyword/value string is passed as it is.
func libpqConn(raw string) (conn, password string) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return raw, ""
	}
	if u.User != nil {
		password, _ = u.User.Password()
		u.User = url.User(u.User.Username())
	}
	q := u.Query()
	for k := range q {
		if strings.HasPrefix(k, "pool_") || slices.Contains(pgxOnlyParams, k) {
			q.Del(k)
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), password
}

// runTool runs a Postgres client program against the database at url,
// with the URL's password in the environment. libpq's other PG* variables
// are passed on: pgx reads the same ones, so the program sees the database
// the server does. Its stderr is kept for the error.
func runTool(ctx context.Context, tool pgTool, url string, args ...string) error {
	conn, password := libpqConn(url)
	env := append(os.Environ(), "PGAPPNAME=bulwark-backup")
	if password != "" {
		env = append(env, "PGPASSWORD="+password)
	}
	cmd := exec.CommandContext(ctx, tool.path, append(args, "--dbname="+conn)...)
	cmd.Env = env
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("backup: %s: %w: %s", filepath.Base(tool.path), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// limitedBuffer keeps the first maxToolOutput bytes written to it.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxToolOutput - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
