package db

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// binCandidate is a directory holding initdb and postgres.
type binCandidate struct {
	dir     string
	version string // major version, as in PG_VERSION
}

// findBinDir picks the directory of the Postgres binaries: explicit if
// given, else among PATH, pg_config --bindir and /usr/lib/postgresql/*/bin
// the one matching want (the version of an existing cluster), else the
// highest version.
func findBinDir(ctx context.Context, explicit, want string) (string, error) {
	const install = "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql)"
	if explicit != "" {
		if !hasServerBinaries(explicit) {
			return "", fmt.Errorf("db: managed postgres: no initdb and postgres in %s: %s or set the Postgres bin directory correctly", explicit, install)
		}
		return explicit, nil
	}
	var dirs []string
	if p, err := exec.LookPath("postgres"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	dirs = append(dirs, globbed...)
	more, _ := filepath.Glob("/usr/pgsql-*/bin") // RPM layout
	dirs = append(dirs, more...)

	var cands []binCandidate
	seen := map[string]bool{}
	for _, d := range dirs {
		if seen[d] || !hasServerBinaries(d) {
			continue
		}
		seen[d] = true
		v, err := binVersion(ctx, d)
		if err != nil {
			continue
		}
		cands = append(cands, binCandidate{dir: d, version: v})
	}
	if len(cands) == 0 {
		return "", fmt.Errorf("db: managed postgres: no PostgreSQL server binaries (initdb, postgres) found in PATH, pg_config --bindir or /usr/lib/postgresql/*/bin: %s, or set BULWARK_DATABASE_URL to use an existing server", install)
	}
	if want != "" {
		for _, c := range cands {
			if c.version == want {
				return c.dir, nil
			}
		}
		return "", fmt.Errorf("db: managed postgres: the cluster was created by PostgreSQL %s but only %s found: install PostgreSQL %s or upgrade the cluster with pg_upgrade", want, describe(cands), want)
	}
	// Stable sort: among equal versions, the earlier source (PATH) wins.
	slices.SortStableFunc(cands, func(a, b binCandidate) int { return compareVersions(b.version, a.version) })
	return cands[0].dir, nil
}

func describe(cands []binCandidate) string {
	var parts []string
	for _, c := range cands {
		parts = append(parts, c.version+" ("+c.dir+")")
	}
	return strings.Join(parts, ", ")
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// binVersion returns the major version of the server in dir ("15", or
// "9.6" for old releases), as PG_VERSION spells it.
func binVersion(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "postgres"), "-V").Output()
	if err != nil {
		return "", fmt.Errorf("db: managed postgres: %s -V: %w", filepath.Join(dir, "postgres"), err)
	}
	// "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "", fmt.Errorf("db: managed postgres: unexpected version output %q", out)
	}
	parts := strings.Split(fields[2], ".")
	if n, err := strconv.Atoi(parts[0]); err == nil && n < 10 && len(parts) > 1 {
		return parts[0] + "." + parts[1], nil
	}
	// Development builds say "17devel" or "17beta1": keep the leading digits.
	major := parts[0]
	if i := strings.IndexFunc(major, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		major = major[:i]
	}
	return major, nil
}

// compareVersions orders major versions numerically ("9.6" < "15").
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}
