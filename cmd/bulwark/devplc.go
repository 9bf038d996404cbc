package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// newDevPLC returns the development PLC directory serve runs when
// cfg.DevPLC (a local host name and no PLC URL): its DIDs are kept in the
// server's own database, so they live exactly as long as its accounts.
// nil when the server uses a real directory.
func newDevPLC(cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger) *plctest.Directory {
	if !cfg.DevPLC {
		return nil
	}
	logger.Info("development PLC at "+cfg.PLCURL, "url", cfg.PLCURL, "store", "postgres")
	return plctest.NewDirectory(plctest.NewPostgresStore(pool))
}

// devPLCPathPrefix starts every path of the PLC directory API (/{did},
// /{did}/log/audit, ...). No PDS route begins so, which lets one listener
// serve both and the server's own URL be its PLC URL: clients resolve its
// DIDs there (goat --plc-host, @atproto/identity's plcUrl, indigo's
// PLCURL) with nothing else to run or configure. The PDS serves these
// paths (publicRoutes) under its middleware and the global limit.
const devPLCPathPrefix = "/did:plc:"

// DefaultDevPLCListen is where `bulwark dev-plc` listens by default; point
// a server at it with BULWARK_PLC_URL=http://127.0.0.1:2582 (a server
// with a local host name and no PLC URL runs a development PLC itself;
// this standalone one is for several servers sharing one).
const DefaultDevPLCListen = "127.0.0.1:2582"

// runDevPLC is `bulwark dev-plc`: a local PLC directory for development
// (package plctest), so that `make run` can create accounts without
// touching plc.directory. It verifies every operation like the real
// directory and keeps its log in a file, so DIDs survive restarts.
func runDevPLC(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("dev-plc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", DefaultDevPLCListen, "address to serve on")
	file := fs.String("file", "plc-log.jsonl", "file holding the operation log (created if missing)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: bulwark dev-plc [flags]\n\nA local PLC directory for development. Run the server with\nBULWARK_PLC_URL=http://<listen> to use it. Not for production.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	dir, err := plctest.Open(*file)
	if err != nil {
		logger.Error("open plc log", "error", err)
		return 1
	}
	defer dir.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		logger.Error("listen", "error", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hs := &http.Server{Handler: dir, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	logger.Info("dev PLC directory serving", "url", "http://"+ln.Addr().String(), "file", *file, "dids", dir.Count())
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("serve", "error", err)
		return 1
	}
	return 0
}
