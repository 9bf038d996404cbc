package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// PrivateMux is the private listener's routes: /metrics and the
// net/http/pprof endpoints under /debug/pprof/. pprof is registered here
// explicitly rather than through its init-time side effect on
// http.DefaultServeMux, so it can never leak onto the public listener.
func PrivateMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", Handler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Serve runs the private listener (/metrics and pprof) on addr until ctx
// ends, then shuts it down. It returns an error at once if addr cannot be
// bound, and nil after a clean shutdown. Bind it to a private address
// (127.0.0.1 or an internal network): pprof exposes command lines, heap
// contents and CPU profiles.
func Serve(ctx context.Context, addr string, logger *slog.Logger) error {
	return ServeHandler(ctx, addr, PrivateMux(), logger)
}

// ServeHandler is Serve with the private listener's routes given: a
// PrivateMux with more private pages (the operator console) on it.
func ServeHandler(ctx context.Context, addr string, h http.Handler, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	return serveHandler(ctx, ln, h, logger)
}

// ServeListener is ServeHandler on a listener the caller bound, so that a
// busy address is reported before a slow start-up rather than after it.
func ServeListener(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	return serveHandler(ctx, ln, h, logger)
}

func serve(ctx context.Context, ln net.Listener, logger *slog.Logger) error {
	return serveHandler(ctx, ln, PrivateMux(), logger)
}

func serveHandler(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// No WriteTimeout: /debug/pprof/profile and trace stream for as
		// long as the caller asks (?seconds=30).
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("metrics listener started", "addr", ln.Addr().String())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("metrics listener: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// A profile still streaming: cut it off.
		_ = srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics listener: %w", err)
	}
	logger.Info("metrics listener stopped")
	return nil
}
