package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/backup"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/serverid"
)

// backupFlags are the settings of serve that backup and restore read; the
// usage lists them (every other serve flag is accepted and ignored).
var backupFlags = []string{"data-dir", "database-url", "blob-dir", "blob-s3-bucket", "hostname", "log-level", "log-format"}

// runBackup is `bulwark backup [--out DIR | -]`.
func runBackup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, cfg := settingsFlags("backup", stderr)
	out := fs.String("out", "", `directory to write the backup into (new or empty), or "-" for a tar stream on stdout (default: ./bulwark-backup-<UTC time>)`)
	binDir := fs.String("pg-bin-dir", os.Getenv("BULWARK_PG_BIN_DIR"), "directory of pg_dump (default: where the Postgres programs are found) [$BULWARK_PG_BIN_DIR]")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: bulwark backup [--out DIR | --out -] [flags]

Back up a Bulwark server, running or not: a pg_dump of its database (one
consistent snapshot), the blobs of its disk store, and <data-dir>/secrets,
with a manifest of checksums. The database and directories are the ones
serve uses, chosen by the same flags and BULWARK_* variables. Blobs in S3
are not copied: back the bucket up with the provider's tools.

Flags:
`)
		printSomeFlags(fs, append([]string{"out", "pg-bin-dir"}, backupFlags...))
	}
	if code, ok := parseSettings(fs, cfg, args); !ok {
		return code
	}
	if *out == "" {
		*out = "bulwark-backup-" + time.Now().UTC().Format("20060102T150405Z")
	}
	// With a tar stream on stdout, everything else goes to stderr.
	report := stdout
	if *out == "-" {
		report = stderr
	}
	logger := cfg.NewLogger(stderr)
	m, err := takeBackup(ctx, cfg, *out, *binDir, stdout, logger)
	if err != nil {
		fmt.Fprintln(stderr, "bulwark backup:", err)
		return 1
	}
	where := *out
	if where == "-" {
		where = "stdout (tar)"
	}
	printManifest(report, "backed up to "+where, m)
	return 0
}

// printSomeFlags prints the usage of the named flags only.
func printSomeFlags(fs *flag.FlagSet, names []string) {
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil {
			continue
		}
		fmt.Fprintf(fs.Output(), "  --%s\n    \t%s\n", f.Name, f.Usage)
	}
	fmt.Fprintln(fs.Output(), "\nEvery other flag of serve is accepted too (bulwark serve -h).")
}

func takeBackup(ctx context.Context, cfg *config.Config, out, binDir string, stdout io.Writer, logger *slog.Logger) (*backup.Manifest, error) {
	dbURL, closeDB, err := backupDatabase(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	hostname, hostNote := backupHostname(ctx, cfg, dbURL)
	src := backup.Source{
		DatabaseURL: dbURL,
		SecretsDir:  filepath.Join(cfg.DataDir, config.SecretsDir),
		Hostname:    hostname,
		Version:     Version(),
		PGBinDir:    binDir,
		Notes:       secretNotes(filepath.Join(cfg.DataDir, config.SecretsDir)),
		Logger:      logger,
	}
	if hostNote != "" {
		src.Notes = append(src.Notes, hostNote)
	}
	if cfg.BlobS3Bucket != "" {
		src.S3Bucket = cfg.BlobS3Bucket
	} else {
		src.BlobDir = cfg.BlobDir
	}
	if out == "-" {
		return backup.ToTar(ctx, src, stdout, "")
	}
	return backup.ToDir(ctx, src, out)
}

// backupHostname is the host name the backup records: the one the
// database records as its accounts' (the server's, whatever this command
// was configured with), else the configured one, with a note saying how
// far to trust it.
func backupHostname(ctx context.Context, cfg *config.Config, dbURL string) (string, string) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var h serverid.Host
	conn, err := pgx.Connect(cctx, dbURL)
	if err == nil {
		h, err = serverid.RecordedHost(cctx, conn)
		_ = conn.Close(cctx)
	}
	switch {
	case err == nil && h.Hostname != cfg.Hostname && !cfg.HostnameDerived():
		return h.Hostname, "the database's accounts are served as " + h.Hostname + ", not as the configured " + cfg.Hostname + ": the manifest records " + h.Hostname
	case err == nil:
		return h.Hostname, ""
	case cfg.HostnameDerived():
		return cfg.Hostname, "the database records no host name (no server of this version has started on it) and BULWARK_HOSTNAME was not set, so the manifest records " + cfg.Hostname + ", made from the listen port: serve the restored data under the server's real host name"
	default:
		return cfg.Hostname, "the database records no host name (no server of this version has started on it): the manifest records the configured " + cfg.Hostname
	}
}

// secretNotes says which of the server's three secrets the backup will not
// hold, or holds only as a file the environment overrides: the restorer
// must bring those along. The rotation key matters most: it seals the
// accounts' signing keys and controls their DIDs.
func secretNotes(dir string) []string {
	var notes []string
	for _, s := range []struct{ file, env string }{
		{"admin-password", "BULWARK_ADMIN_PASSWORD"},
		{"jwt-secret", "BULWARK_JWT_SECRET"},
		{"plc-rotation-key", "BULWARK_PLC_ROTATION_KEY"},
	} {
		_, err := os.Stat(filepath.Join(dir, s.file))
		switch {
		case strings.TrimSpace(os.Getenv(s.env)) != "":
			notes = append(notes, fmt.Sprintf("%s is set in the environment, which the server uses instead of any file: keep its value with this backup", s.env))
		case err != nil:
			notes = append(notes, fmt.Sprintf("%s is not in %s: keep the value the server runs with (%s) with this backup", s.file, dir, s.env))
		}
	}
	return notes
}

// backupDatabase returns the URL of the database to dump: the external one
// (its direct URL when one is set: pg_dump keeps one snapshot on one
// session, which a transaction-mode pooler would break), or the managed
// cluster's. A running server's cluster is reached through
// the socket its postmaster.pid names; a stopped one is started for the
// backup and stopped by the returned func.
func backupDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger) (string, func(), error) {
	if cfg.DatabaseDirectURL != "" {
		return cfg.DatabaseDirectURL, func() {}, nil
	}
	if cfg.DatabaseURL != "" {
		return cfg.DatabaseURL, func() {}, nil
	}
	dir := filepath.Join(cfg.DataDir, ManagedPostgresDir)
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		return "", nil, fmt.Errorf("no managed Postgres cluster in %s to back up (is --data-dir / BULWARK_DATA_DIR right? with an external database set --database-url)", dir)
	}
	if u, ok := runningClusterURL(ctx, dir); ok {
		logger.Info("backing up the running server's database", "socket_dir", socketOf(u))
		return u, func() {}, nil
	}
	if err := requireOwner(cfg.DataDir, "backup"); err != nil {
		return "", nil, err
	}
	m, err := db.StartManaged(ctx, db.ManagedConfig{Dir: dir, Logger: logger, Settings: cfg.PostgresSettings})
	if err != nil {
		return "", nil, fmt.Errorf("managed postgres: %w", err)
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := m.Stop(sctx); err != nil {
			logger.Error("stopping managed postgres", "error", err)
		}
	}
	return m.URL(db.ManagedDatabase), stop, nil
}

// runningClusterURL returns the URL of the database of a postmaster running
// on the managed cluster in dir, read from its postmaster.pid (line 4: the
// port, line 5: the socket directory), if it answers.
func runningClusterURL(ctx context.Context, dir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return "", false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 5 {
		return "", false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 || !processExists(pid) {
		return "", false
	}
	port, sock := strings.TrimSpace(lines[3]), strings.TrimSpace(lines[4])
	if sock == "" || port == "" {
		return "", false
	}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/" + db.ManagedDatabase,
		RawQuery: url.Values{"host": {sock}, "port": {port}, "sslmode": {"disable"}}.Encode()}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, u.String())
	if err != nil {
		return "", false
	}
	_ = conn.Close(cctx)
	return u.String(), true
}

// requireOwner refuses to run as root on a data dir another user owns (a
// service's, under systemd): as root, the managed Postgres would be started
// as the postgres user and take the cluster over, and the files written
// would be root's.
func requireOwner(dataDir, command string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	name := strconv.FormatUint(uint64(st.Uid), 10)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	return fmt.Errorf("%s belongs to user %s: run bulwark %s as that user (sudo -u %s bulwark %s ...), so that the server's files and Postgres cluster keep their owner", dataDir, name, command, name, command)
}

// processExists reports whether a process with this pid exists (EPERM: it
// does, under another user, as the postmaster does when we are root).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func socketOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Query().Get("host")
}

// printManifest summarises a backup for the operator.
func printManifest(w io.Writer, title string, m *backup.Manifest) {
	fmt.Fprintf(w, "%s\n", title)
	fmt.Fprintf(w, "  taken      %s by bulwark %s\n", m.CreatedAt.Format(time.RFC3339), m.BulwarkVersion)
	fmt.Fprintf(w, "  hostname   %s\n", m.Hostname)
	fmt.Fprintf(w, "  database   %s, %d bytes, sha256 %s (PostgreSQL %d)\n", m.Database.File, m.Database.Bytes, m.Database.SHA256, m.Database.ServerMajor)
	switch m.Blobs.Store {
	case backup.StoreDisk:
		fmt.Fprintf(w, "  blobs      %d, %d bytes\n", m.Blobs.Count, m.Blobs.Bytes)
	case backup.StoreS3:
		fmt.Fprintf(w, "  blobs      in S3 bucket %s (not in the backup)\n", m.Blobs.S3Bucket)
	}
	var names []string
	for _, f := range m.Secrets.Files {
		names = append(names, f.Name)
	}
	fmt.Fprintf(w, "  secrets    %s\n", orDash(strings.Join(names, ", ")))
	for _, n := range m.Notes {
		fmt.Fprintf(w, "  NOTE: %s\n", n)
	}
}
