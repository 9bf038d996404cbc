// Command fakeservices runs a fake app view, chat service and feed
// generator (package internal/fakeservices) for end-to-end runs of
// Bulwark's service proxy with other people's clients
// (scripts/proxy-api.sh). It registers their DIDs in the PLC directory at
// --plc-url, writes their DIDs and URLs to --env-file as shell
// assignments, and serves until SIGINT or SIGTERM. Not for production.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/bulwark-pds/bulwark/internal/fakeservices"
)

func main() {
	plcURL := flag.String("plc-url", "http://127.0.0.1:2582", "PLC directory to register in and resolve callers from")
	host := flag.String("host", "127.0.0.1", "address to listen on (one port per service)")
	envFile := flag.String("env-file", "", "file to write APPVIEW_URL, APPVIEW_DID, CHAT_DID, ... to (shell assignments)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svcs, err := fakeservices.Start(ctx, fakeservices.Config{PLCURL: *plcURL, Host: *host, Logger: logger})
	if err != nil {
		logger.Error("start", "error", err)
		os.Exit(1)
	}
	defer svcs.Close()
	env := fmt.Sprintf("APPVIEW_URL=%s\nAPPVIEW_DID=%s\nCHAT_URL=%s\nCHAT_DID=%s\nFEEDGEN_URL=%s\nFEEDGEN_DID=%s\nFEED_URI=%s\n",
		svcs.AppView.URL, svcs.AppView.DID, svcs.Chat.URL, svcs.Chat.DID, svcs.FeedGen.URL, svcs.FeedGen.DID, svcs.FeedURI)
	if *envFile != "" {
		// Written whole under another name, then renamed: a script waiting
		// for the file never reads half of it.
		tmp := *envFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(env), 0o644); err != nil {
			logger.Error("write env file", "error", err)
			os.Exit(1)
		}
		if err := os.Rename(tmp, *envFile); err != nil {
			logger.Error("write env file", "error", err)
			os.Exit(1)
		}
	}
	logger.Info("fake services serving", "appview", svcs.AppView.URL, "chat", svcs.Chat.URL, "feedgen", svcs.FeedGen.URL)
	<-ctx.Done()
}
