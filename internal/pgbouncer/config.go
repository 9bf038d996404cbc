// Package pgbouncer writes the configuration of a PgBouncer in
// transaction mode, the way managed Postgres products put one in front of
// the database, for the tests and the cluster check that run one.
package pgbouncer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Config is a PgBouncer in transaction mode on 127.0.0.1:Port in front of
// the Postgres server at Server ("host=... port=...", libpq style), with
// trust authentication for the postgres user.
type Config struct {
	Server    string
	Port      int
	PoolSize  int // default_pool_size (default 4)
	MaxClient int // max_client_conn (0: PgBouncer's default)
	// IgnoreStartup names startup parameters to pass over instead of
	// refusing them (ignore_startup_parameters).
	IgnoreStartup []string
}

// Write writes pgbouncer.ini and its users.txt into dir (which also gets
// the log and pid files) and returns the ini file's path.
func (c Config) Write(dir string) (string, error) {
	pool := c.PoolSize
	if pool <= 0 {
		pool = 4
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[databases]\n* = %s\n[pgbouncer]\n", c.Server)
	fmt.Fprintf(&b, "listen_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n", c.Port)
	fmt.Fprintf(&b, "auth_type = trust\nauth_file = %s\n", filepath.Join(dir, "users.txt"))
	fmt.Fprintf(&b, "pool_mode = transaction\ndefault_pool_size = %d\n", pool)
	if c.MaxClient > 0 {
		fmt.Fprintf(&b, "max_client_conn = %d\n", c.MaxClient)
	}
	fmt.Fprintf(&b, "logfile = %s\npidfile = %s\n", filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if len(c.IgnoreStartup) > 0 {
		fmt.Fprintf(&b, "ignore_startup_parameters = %s\n", strings.Join(c.IgnoreStartup, ","))
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		return "", err
	}
	return ini, nil
}
