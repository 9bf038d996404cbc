package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/internal/populate"
)

// serverInfo is what the curve reads from the populated database before
// the server starts: its size, and the accounts the measurements use.
type serverInfo struct {
	accounts                 int
	records, events, dbBytes int64
	shape                    populate.Config
	lastSeq                  int64
	// pruneCutoff: events created before it are older than the backfill's
	// window; retention pruning is measured on them.
	pruneCutoff time.Time
	// random are accounts at random; writers are realistic accounts, the
	// createRecord clients; medians hold the realistic median of records.
	random, writers, medians []acct
	largest                  acct
}

type acct struct{ handle, did string }

const (
	randomAccounts = 2000
	writerAccounts = 17
	medianAccounts = 100
)

// withDatabase runs fn on the data dir's managed Postgres, started for it.
func withDatabase(ctx context.Context, o curveOptions, logger *slog.Logger, fn func(*pgxpool.Pool) error) error {
	cfg := config.DefaultConfig()
	cfg.DataDir = o.dataDir
	pool, closeDB, err := openServerDatabase(ctx, cfg, quiet(logger))
	if err != nil {
		return err
	}
	defer closeDB()
	return fn(pool)
}

func quiet(l *slog.Logger) *slog.Logger {
	return slog.New(slog.NewTextHandler(discardWriter{}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func readServerInfo(ctx context.Context, o curveOptions, logger *slog.Logger) (*serverInfo, error) {
	info := &serverInfo{}
	err := withDatabase(ctx, o, logger, func(pool *pgxpool.Pool) error {
		var seed int64
		if err := pool.QueryRow(ctx, qCurveSettings).Scan(&seed, &info.shape.Realistic, &info.shape.Largest, &info.shape.HandleDomain); err != nil {
			return fmt.Errorf("populate settings (was the database populated?): %w", db.Translate(err))
		}
		info.shape.Seed = uint64(seed)
		var accounts int64
		if err := pool.QueryRow(ctx, qCurveTotals).Scan(&accounts, &info.records, &info.events, &info.dbBytes); err != nil {
			return db.Translate(err)
		}
		info.accounts = int(accounts)
		info.shape.Accounts = info.accounts
		if err := pool.QueryRow(ctx, qCurveLastSeq).Scan(&info.lastSeq); err != nil {
			return db.Translate(err)
		}
		err := pool.QueryRow(ctx, qCurveEventTime, max(info.lastSeq-int64(o.backfill), 1)).Scan(&info.pruneCutoff)
		if err != nil && !errors.Is(db.Translate(err), db.ErrNotFound) {
			return db.Translate(err)
		}
		return info.pickAccounts(ctx, pool)
	})
	return info, err
}

// pickAccounts chooses the accounts the measurements use and looks up
// their DIDs.
func (info *serverInfo) pickAccounts(ctx context.Context, pool *pgxpool.Pool) error {
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	realistic := min(info.shape.Realistic, info.accounts)
	var random, writers, medians []int
	for range randomAccounts {
		random = append(random, r.IntN(info.accounts))
	}
	for range writerAccounts {
		writers = append(writers, 1+r.IntN(max(realistic-1, 1)))
	}
	// Accounts of 20 records: the realistic distribution's median.
	from := r.IntN(realistic)
	for k := 0; k < realistic && len(medians) < medianAccounts; k++ {
		i := (from + k) % realistic
		if i != 0 && populate.ShapeOf(&info.shape, i).Records == 20 {
			medians = append(medians, i)
		}
	}
	var err error
	if info.random, err = lookup(ctx, pool, &info.shape, random); err != nil {
		return err
	}
	if info.writers, err = lookup(ctx, pool, &info.shape, writers); err != nil {
		return err
	}
	if info.medians, err = lookup(ctx, pool, &info.shape, medians); err != nil {
		return err
	}
	largest, err := lookup(ctx, pool, &info.shape, []int{0})
	if err != nil {
		return err
	}
	info.largest = largest[0]
	return nil
}

func lookup(ctx context.Context, pool *pgxpool.Pool, shape *populate.Config, idx []int) ([]acct, error) {
	handles := make([]string, len(idx))
	for i, k := range idx {
		handles[i] = shape.Handle(k)
	}
	rows, err := pool.Query(ctx, qCurveDIDs, handles)
	if err != nil {
		return nil, db.Translate(err)
	}
	dids := map[string]string{}
	for rows.Next() {
		var h, d string
		if err := rows.Scan(&h, &d); err != nil {
			return nil, db.Translate(err)
		}
		dids[h] = d
	}
	if err := rows.Err(); err != nil {
		return nil, db.Translate(err)
	}
	out := make([]acct, 0, len(handles))
	for _, h := range handles {
		if d, ok := dids[h]; ok {
			out = append(out, acct{handle: h, did: d})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none of %d populated accounts found", len(handles))
	}
	return out, nil
}

// serverEnv is the environment the measured server and commands get.
func (o curveOptions) serverEnv() []string {
	host, port, _ := net.SplitHostPort(o.listen)
	p, _ := strconv.Atoi(port)
	return append(os.Environ(),
		"BULWARK_DATA_DIR="+o.dataDir,
		"BULWARK_LISTEN="+o.listen,
		"BULWARK_HOSTNAME="+o.hostname,
		"BULWARK_HANDLE_DOMAINS="+o.handles,
		"BULWARK_RATELIMITS=off",
		"BULWARK_FIREHOSE_ALLOW=127.0.0.0/8",
		"BULWARK_FIREHOSE_RETENTION=87600h",
		"BULWARK_METRICS_LISTEN="+net.JoinHostPort(host, strconv.Itoa(p+1)),
	)
}

// measureMigrate times bulwark migrate up on the full database (no server
// running): what an upgrade with no new migration costs.
func measureMigrate(ctx context.Context, o curveOptions, res *curveResult) error {
	start := time.Now()
	out, err := o.command(ctx, "migrate", "up").CombinedOutput()
	if err != nil {
		return fmt.Errorf("bulwark migrate up: %w: %s", err, out)
	}
	res.Walks["migrate"] = &walkFigures{Seconds: time.Since(start).Seconds()}
	return nil
}

func (o curveOptions) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, o.bulwark, args...)
	cmd.Env = o.serverEnv()
	return cmd
}

// server is the measured bulwark serve.
type server struct {
	cmd     *exec.Cmd
	pid     int
	base    string
	metrics string
	done    chan error
}

// startServer starts bulwark serve and times it to its first healthy
// answer.
func startServer(ctx context.Context, o curveOptions, res *curveResult, logger *slog.Logger) (*server, error) {
	log, err := os.OpenFile(filepath.Join(o.out, res.Label+"-server.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.bulwark, "serve")
	cmd.Env = o.serverEnv()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	host, port, _ := net.SplitHostPort(o.listen)
	p, _ := strconv.Atoi(port)
	s := &server{cmd: cmd, base: "http://" + o.listen, metrics: "http://" + net.JoinHostPort(host, strconv.Itoa(p+1)), done: make(chan error, 1)}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	s.pid = cmd.Process.Pid
	go func() { s.done <- cmd.Wait(); log.Close() }()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case err := <-s.done:
			return nil, fmt.Errorf("bulwark serve exited before it was ready (%v); see %s", err, log.Name())
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-s.done
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		resp, err := client.Get(s.base + "/xrpc/_health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
	}
	_, rss, _ := readProc(s.pid)
	res.Walks["startup"] = &walkFigures{Seconds: time.Since(start).Seconds(), RSSMax: mb(rss)}
	logger.Info("server ready", "pid", s.pid, "startup", time.Since(start).Round(time.Millisecond))
	return s, nil
}

// stop sends SIGTERM and times the shutdown.
func (s *server) stop(res *curveResult) error {
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-s.done:
	case <-time.After(2 * time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.done
		return errors.New("the server did not stop within 2 minutes of SIGTERM")
	}
	res.Walks["shutdown"] = &walkFigures{Seconds: time.Since(start).Seconds()}
	return nil
}

// measurePrune runs the server's retention pruner (eventlog.Pruner, its
// batches and pauses) on the events older than the backfill's window: the
// populated history of earlier runs. It deletes them for real.
func measurePrune(ctx context.Context, o curveOptions, info *serverInfo, res *curveResult, logger *slog.Logger) error {
	if info.pruneCutoff.IsZero() {
		return errors.New("no event at the backfill cursor")
	}
	return withDatabase(ctx, o, logger, func(pool *pgxpool.Pool) error {
		var before int64
		if err := pool.QueryRow(ctx, qCurveEventsBefore, info.pruneCutoff).Scan(&before); err != nil {
			return db.Translate(err)
		}
		now := time.Now()
		p := eventlog.NewPruner(pool, eventlog.PrunerConfig{Retention: now.Sub(info.pruneCutoff), Logger: quiet(logger)})
		start := time.Now()
		n, err := p.Prune(ctx, now)
		if err != nil {
			return err
		}
		el := time.Since(start)
		res.Walks["prune"] = &walkFigures{Seconds: el.Seconds(), Items: n, Rate: float64(n) / el.Seconds(),
			Note: fmt.Sprintf("%d events older than the backfill window", before)}
		return nil
	})
}

// measureBackup times bulwark backup of the whole server and sizes it; the
// backup is removed afterwards.
func measureBackup(ctx context.Context, o curveOptions, res *curveResult) error {
	dir := filepath.Join(o.out, res.Label+"-backup")
	_ = os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	start := time.Now()
	out, err := o.command(ctx, "backup", "--out", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("bulwark backup: %w: %s", err, out)
	}
	el := time.Since(start)
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	res.Walks["backup"] = &walkFigures{Seconds: el.Seconds(), Bytes: size}
	return nil
}
