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
	fs, cfg := settingsFlags("config", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: bulwark config [flags]\n\nPrints the settings `bulwark serve` would run with, given the same flags and\nenvironment, one per line, secrets redacted.\n\nFlags:")
		fs.PrintDefaults()
	}
	if code, ok := parseSettings(fs, cfg, args); !ok {
		return code
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

// settingsFlags is the flag set of a command that reads serve's settings:
// every serve flag with its BULWARK_* variable, errors and usage to stderr.
func settingsFlags(name string, stderr io.Writer) (*flag.FlagSet, *config.Config) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config.DefaultConfig()
	cfg.RegisterFlags(fs)
	return fs, cfg
}

// parseSettings parses args, which must be flags only, and finalizes the
// configuration; ok is false when the command must exit with code.
func parseSettings(fs *flag.FlagSet, cfg *config.Config, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "bulwark %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2, false
	}
	if err := cfg.Finalize(); err != nil {
		fmt.Fprintln(fs.Output(), "bulwark:", err)
		return 2, false
	}
	return 0, true
}
