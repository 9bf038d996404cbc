// Command devdns serves DNS records for end-to-end runs on one machine
// (package internal/devdns): Bulwark started with --dns-server pointing at
// it resolves lexicon authorities (_lexicon TXT records) and handles
// there. Records are given as flags, or set while it runs with a POST to
// the control address (loopback only):
//
//	curl -d name=_lexicon.example.test -d value=did=did:plc:... http://127.0.0.1:CONTROL/txt
//
// It serves until SIGINT or SIGTERM. Not for production.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/bulwark-pds/bulwark/internal/devdns"
)

type records []string

func (r *records) String() string     { return strings.Join(*r, ",") }
func (r *records) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	listen := flag.String("listen", "127.0.0.1:5353", "address to serve DNS on (UDP and TCP)")
	control := flag.String("control", "", "loopback address of the control endpoint (POST /txt name=..&value=..); empty: none")
	var txt records
	flag.Var(&txt, "txt", "a TXT record, name=value (repeatable)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *control, txt, logger); err != nil {
		logger.Error("devdns", "error", err)
		os.Exit(1)
	}
}

func run(listen, control string, txt records, logger *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := devdns.Start(listen)
	if err != nil {
		return err
	}
	defer srv.Close()
	for _, r := range txt {
		name, value, ok := strings.Cut(r, "=")
		if !ok {
			return fmt.Errorf("%w: %q", devdns.ErrBadRecord, r)
		}
		srv.SetTXT(name, value)
	}
	if control != "" {
		host, _, err := net.SplitHostPort(control)
		if err != nil || !net.ParseIP(host).IsLoopback() {
			return errors.New("--control must be a loopback host:port")
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /txt", func(w http.ResponseWriter, r *http.Request) {
			name, value := r.PostFormValue("name"), r.PostFormValue("value")
			if name == "" {
				http.Error(w, "name is required", http.StatusBadRequest)
				return
			}
			srv.SetTXT(name, value)
			logger.Info("TXT record set", "name", name, "value", value)
			w.WriteHeader(http.StatusNoContent)
		})
		hs := &http.Server{Addr: control, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		ln, err := net.Listen("tcp", control)
		if err != nil {
			return err
		}
		go func() { _ = hs.Serve(ln) }()
		defer hs.Close()
	}
	logger.Info("devdns serving", "addr", srv.Addr, "control", control)
	<-ctx.Done()
	return nil
}
