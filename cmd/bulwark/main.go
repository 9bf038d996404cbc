// Command bulwark is the Bulwark PDS: one binary with subcommands.
//
//	bulwark serve [flags]            run the server (managed Postgres unless --database-url)
//	bulwark migrate [flags] up       apply pending database migrations
//	bulwark migrate [flags] status   list migrations and whether they are applied
//	bulwark admin [flags] COMMAND    administer a running server (accounts, invites, firehose, audit)
//	bulwark backup [--out DIR|-]     back up the database, blobs and secrets
//	bulwark restore --from DIR|-     restore a backup into an empty data dir
//	bulwark config [flags]           print the effective settings, secrets redacted
//	bulwark version                  print the version
//
// Every flag has a BULWARK_* environment variable (see `bulwark serve -h`
// and the README).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version is set at build time (-ldflags "-X main.version=..."); see the
// Makefile. Otherwise it falls back to the module version from the build
// info (go install ...@v1.2.3) or "dev".
var version = ""

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the process exit code: 0 success,
// 1 failure, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	cmd, rest := args[0], args[1:]
	// One case per subcommand. A new one (admin, keys, ...) is a case here
	// plus a file with its run function.
	switch cmd {
	case "serve":
		return runServe(ctx, rest, stderr)
	case "migrate":
		return runMigrate(ctx, rest, stdout, stderr)
	case "config":
		return runConfig(ctx, rest, stdout, stderr)
	case "dev-plc":
		return runDevPLC(ctx, rest, stderr)
	case "admin":
		return runAdmin(ctx, rest, stdout, stderr)
	case "backup":
		return runBackup(ctx, rest, stdout, stderr)
	case "restore":
		return runRestore(ctx, rest, os.Stdin, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "bulwark %s (%s, %s/%s)\n", Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "help", "-h", "--help", "-help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "bulwark: unknown command %q\n\n", cmd)
		usage(stderr)
		return 2
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `Bulwark: an atproto Personal Data Server.

Usage:
  bulwark serve [flags]             run the server
  bulwark migrate [flags] up        apply pending database migrations
  bulwark migrate [flags] status    show which migrations are applied
  bulwark admin COMMAND             inspect and repair a running server
                                    ("bulwark admin -h" lists the commands)
  bulwark backup [--out DIR|-]      back up the database, blobs and secrets
  bulwark restore --from DIR|-      restore a backup into an empty data dir
  bulwark config [flags]            print the settings serve would use, one per line
  bulwark dev-plc [flags]           run a local PLC directory for development
  bulwark version                   print the version

Run "bulwark serve -h" for the settings; each flag has a BULWARK_*
environment variable (--data-dir is BULWARK_DATA_DIR).
`)
}

// Version is the version string this binary reports.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
