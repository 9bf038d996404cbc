package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/backup"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// restoreStagingDir is where `restore --from -` unpacks the stream, inside
// the data dir (the blob store's file system, usually), removed afterwards.
const restoreStagingDir = ".restore-staging"

// runRestore is `bulwark restore --from DIR|-`. stdin is the tar stream for
// --from -.
func runRestore(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs, cfg := settingsFlags("restore", stderr)
	from := fs.String("from", "", `the backup: a directory written by bulwark backup, or "-" for its tar stream on stdin`)
	force := fs.Bool("force", false, "restore into a data dir or database that is not empty: the backup's tables are dropped and recreated, its blobs and secrets written over what is there")
	binDir := fs.String("pg-bin-dir", os.Getenv("BULWARK_PG_BIN_DIR"), "directory of pg_restore (default: where the Postgres programs are found) [$BULWARK_PG_BIN_DIR]")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: bulwark restore --from DIR|- [--force] [flags]

Restore a backup into an empty data dir: initialise the managed Postgres
cluster (or use the empty database of --database-url), restore the
database in one transaction, copy the blobs and secrets. The whole backup
is verified (checksums, every blob against its CID) before anything is
written. The server must not be running on the target. Then start it with
bulwark serve under the backup's host name.

Flags:
`)
		printSomeFlags(fs, append([]string{"from", "force", "pg-bin-dir"}, backupFlags...))
	}
	if code, ok := parseSettings(fs, cfg, args); !ok {
		return code
	}
	if *from == "" {
		fmt.Fprintln(stderr, "bulwark restore: --from is required (a backup directory, or - for a tar stream on stdin)")
		return 2
	}
	logger := cfg.NewLogger(stderr)
	m, lastSeq, err := restoreBackup(ctx, cfg, *from, *force, *binDir, stdin, logger)
	if err != nil {
		fmt.Fprintln(stderr, "bulwark restore:", err)
		return 1
	}
	printManifest(stdout, "restored into "+cfg.DataDir, m)
	if m.Hostname != "" && m.Hostname != cfg.Hostname {
		fmt.Fprintf(stdout, "\nWARNING: the backup is of %s but the configured host name is %s: serve it as %s (BULWARK_HOSTNAME), which its accounts' DIDs and handles name.\n", m.Hostname, cfg.Hostname, m.Hostname)
	}
	printRestoreNext(stdout, m, lastSeq)
	return 0
}

// printRestoreNext prints what to do after a restore. lastSeq is the
// restored firehose's last seq (negative: unknown).
func printRestoreNext(w io.Writer, m *backup.Manifest, lastSeq int64) {
	fmt.Fprintf(w, "\nNext: start the server (bulwark serve) with BULWARK_HOSTNAME=%s; pending migrations run at start.\n", m.Hostname)
	at := "its last event"
	if lastSeq >= 0 {
		at = fmt.Sprintf("seq %d", lastSeq)
	}
	fmt.Fprintf(w, `Next: the restored firehose ends at %s. Relays and other consumers that read the server after this backup was taken
hold cursors beyond it and are refused (FutureCursor), reading nothing, until the sequence is raised past them.
Once the server runs, raise it to the highest cursor they hold (the old server's last seq, if known; the server
logs each consumer it refuses with FutureCursor, with its cursor, and the relay watch reports relays "ahead"):
  bulwark admin firehose raise-seq --floor CURSOR --reason "restored the backup of %s"
Then announce the accounts that committed after the backup: bulwark admin firehose emit-sync --did DID (docs/BACKUP.md).
`, at, m.CreatedAt.UTC().Format("2006-01-02 15:04Z"))
}

// restoreBackup restores the backup at from into cfg's data dir and
// database, and returns its manifest and the restored firehose's last seq
// (-1 when it cannot be read).
func restoreBackup(ctx context.Context, cfg *config.Config, from string, force bool, binDir string, stdin io.Reader, logger *slog.Logger) (*backup.Manifest, int64, error) {
	if !force {
		if err := requireEmpty(cfg.DataDir); err != nil {
			return nil, -1, err
		}
		if cfg.BlobS3Bucket == "" && !within(cfg.BlobDir, cfg.DataDir) {
			if err := requireEmpty(cfg.BlobDir); err != nil {
				return nil, -1, err
			}
		}
	}
	if err := requireOwner(cfg.DataDir, "restore"); err != nil {
		return nil, -1, err
	}
	// 0711: under root the managed Postgres runs as another user, which
	// must reach <data-dir>/postgres.
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, -1, fmt.Errorf("create data dir: %w", err)
	}
	var b *backup.Backup
	var err error
	if from == "-" {
		b, err = backup.OpenTar(ctx, stdin, filepath.Join(cfg.DataDir, restoreStagingDir))
	} else {
		b, err = backup.Open(ctx, from)
	}
	if err != nil {
		return nil, -1, err
	}
	defer b.Close()

	target := backup.Target{
		DatabaseURL: cfg.DatabaseURL,
		SecretsDir:  filepath.Join(cfg.DataDir, config.SecretsDir),
		PGBinDir:    binDir,
		Force:       force,
		Logger:      logger,
	}
	if cfg.BlobS3Bucket == "" {
		target.BlobDir = cfg.BlobDir
	}
	if target.DatabaseURL == "" {
		m, err := db.StartManaged(ctx, db.ManagedConfig{Dir: filepath.Join(cfg.DataDir, ManagedPostgresDir), Logger: logger, Settings: cfg.PostgresSettings})
		if err != nil {
			return nil, -1, fmt.Errorf("managed postgres (no server may run on the target data dir): %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			if err := m.Stop(sctx); err != nil {
				logger.Error("stopping managed postgres", "error", err)
			}
		}()
		target.DatabaseURL = m.URL(db.ManagedDatabase)
	}
	if err := b.Restore(ctx, target); err != nil {
		if errors.Is(err, backup.ErrNotEmpty) {
			return nil, -1, err
		}
		return nil, -1, fmt.Errorf("%w (the target is incomplete: empty the data dir, or restore again with --force)", err)
	}
	return b.Manifest, restoredLastSeq(ctx, target.DatabaseURL, logger), nil
}

// restoredLastSeq reads the restored firehose's last seq, or -1: it is
// only for the advice printed afterwards.
func restoredLastSeq(ctx context.Context, url string, logger *slog.Logger) int64 {
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		defer pool.Close()
		var last int64
		if last, err = eventlog.NewLog(pool).LastSeq(ctx); err == nil {
			return last
		}
	}
	logger.Warn("reading the restored firehose's last seq", "err", err)
	return -1
}

// requireEmpty refuses a directory that holds anything (lost+found, which a
// file system's root has, aside). A missing one is empty.
func requireEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Name() != "lost+found" {
			names = append(names, e.Name())
		}
	}
	if len(names) > 0 {
		return fmt.Errorf("%s is not empty (%s): restore into an empty data dir, or pass --force to restore over it", dir, strings.Join(names, ", "))
	}
	return nil
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
