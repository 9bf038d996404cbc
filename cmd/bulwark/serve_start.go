package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/serverid"
)

// hostCheckTimeout bounds the one DID resolution of the start-up host
// check.
const hostCheckTimeout = 10 * time.Second

// started is what serve holds from its first, fast steps: the listeners
// and the data directory's lock, taken before anything slow so that a busy
// port or a data directory in use fails at once and leaves nothing
// behind.
type started struct {
	ln        net.Listener
	metricsLn net.Listener // nil without --metrics-listen
	unlock    func()
}

func (s *started) close() {
	if s.metricsLn != nil {
		_ = s.metricsLn.Close()
	}
	if s.ln != nil {
		_ = s.ln.Close()
	}
	if s.unlock != nil {
		s.unlock()
	}
}

// startListening binds the public listener and the metrics listener and
// takes the data directory's lock (one server per data directory, with the
// managed database or an external one), in that order.
func startListening(cfg *config.Config) (_ *started, err error) {
	s := &started{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.ln, err = listen(cfg); err != nil {
		return nil, err
	}
	if err = cfg.Bound(s.ln.Addr().String()); err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "" {
		if s.metricsLn, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("listen on %s (--metrics-listen, BULWARK_METRICS_LISTEN): %w%s", cfg.MetricsListen, err, portHint(err))
		}
	}
	// 0711: under root, the managed Postgres runs as an unprivileged user
	// that must be able to reach <data-dir>/postgres.
	if err = os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if s.unlock, err = serverid.Lock(cfg.DataDir); err != nil {
		return nil, err
	}
	return s, nil
}

func portHint(err error) string {
	if errors.Is(err, syscall.EADDRINUSE) {
		return "; another server (another bulwark?) is using the port: stop it, or choose another address"
	}
	return ""
}

// checkHost refuses to serve the accounts of the database under another
// host name than the one their DID documents name (serverid.CheckHost).
func checkHost(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, devPLC *plctest.Directory, logger *slog.Logger) error {
	resolve := func(ctx context.Context, did string) (string, error) {
		d, err := syntax.ParseDID(did)
		if err != nil || d.Method() != "plc" {
			return "", fmt.Errorf("%s is not a did:plc", did)
		}
		rotation, err := cfg.PLCRotationPrivateKey()
		if err != nil {
			return "", err
		}
		hc := &http.Client{Timeout: hostCheckTimeout}
		if devPLC != nil {
			hc = devPLC.Client()
		}
		c, err := plc.NewClient(cfg.PLCURL, rotation, hc)
		if err != nil {
			return "", err
		}
		ctx, cancel := context.WithTimeout(ctx, hostCheckTimeout)
		defer cancel()
		doc, err := c.Resolve(ctx, d)
		if err != nil {
			return "", err
		}
		for _, s := range doc.Service {
			if strings.TrimPrefix(s.ID, did) == "#atproto_pds" {
				return s.ServiceEndpoint, nil
			}
		}
		return "", errors.New("its DID document names no PDS")
	}
	warning, err := serverid.CheckHost(ctx, pool, serverid.Host{Hostname: cfg.Hostname, PublicURL: cfg.PublicURL()}, resolve)
	if err != nil {
		return err
	}
	if warning != "" {
		logger.Warn("host name not checked", "reason", warning, "hostname", cfg.Hostname)
	}
	return nil
}

// publicRoutes are the paths serve adds to the PDS's own, each under the
// PDS's middleware (access log, request id, metrics, CORS) and charged to
// the client's address under the global limit before it runs: who the
// server is (for bulwark admin on this machine; with rt only), which names
// it serves (for a TLS terminator's on-demand certificates), and the
// development PLC's API when the server runs one (devPLC).
func publicRoutes(cfg *config.Config, pool *pgxpool.Pool, rt *serverid.Runtime, devPLC *plctest.Directory) []pds.Route {
	// The PDS has charged the request before these handlers run.
	allow := func(http.ResponseWriter, *http.Request) bool { return true }
	routes := []pds.Route{{Pattern: serverid.AskPath, Handler: serverid.AskHandler(pool, cfg.Hostname, allow)}}
	if rt != nil {
		addrs := serverid.Addresses{Listen: cfg.Listen, PublicURL: cfg.PublicURL()}
		routes = append(routes, pds.Route{Pattern: serverid.IdentifyPath, Handler: serverid.Handler(rt, addrs, allow)})
	}
	if devPLC != nil {
		routes = append(routes, pds.Route{Prefix: devPLCPathPrefix, Handler: devPLC})
	}
	return routes
}

// writeRuntime records the running server in its data directory for
// bulwark admin; the returned func removes the record at shutdown.
func writeRuntime(cfg *config.Config, rt *serverid.Runtime, logger *slog.Logger) (func(), error) {
	if err := rt.Write(cfg.DataDir); err != nil {
		return nil, err
	}
	return func() {
		if err := rt.Remove(cfg.DataDir); err != nil {
			logger.Warn("removing the runtime file", "file", filepath.Join(cfg.DataDir, serverid.RuntimeFile), "error", err)
		}
	}, nil
}
