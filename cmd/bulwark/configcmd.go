package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/bulwark-pds/bulwark/config"
)

// secretFileNames maps the secrets EnsureSecrets keeps in the data dir to
// their files, for settings the configuration leaves unset.
var secretFileNames = map[string]string{
	"admin-password":   config.AdminPasswordFile,
	"jwt-secret":       config.JWTSecretFile,
	"plc-rotation-key": config.RotationKeyFile,
}

// runConfig is `bulwark config [flags]`: the configuration serve would run
// with, from the same flags and BULWARK_* variables, one setting per line
// as BULWARK_NAME=value, with derived defaults filled in and secrets
// redacted. It changes nothing (no secret is generated), and an invalid
// configuration is reported as serve reports it.
func runConfig(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: bulwark config [flags]\n\nPrints the settings `bulwark serve` would run with, given the same flags and\nenvironment, one per line, secrets redacted.\n\nFlags:")
		fs.PrintDefaults()
	}
	cfg := config.DefaultConfig()
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bulwark config: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := cfg.Finalize(); err != nil {
		fmt.Fprintln(stderr, "bulwark:", err)
		return 2
	}
	for _, s := range cfg.Settings() {
		v := s.Value
		if file, ok := secretFileNames[s.Flag]; ok && v == "" {
			v = "(kept in " + filepath.Join(cfg.DataDir, config.SecretsDir, file) + ")"
		}
		fmt.Fprintf(stdout, "%s=%s\n", s.Env, v)
	}
	return 0
}
