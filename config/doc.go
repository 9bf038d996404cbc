// Package config holds Bulwark's settings: one Config struct, its defaults,
// the flags and BULWARK_* environment variables that set it, validation that
// names the offending setting, redaction for logging, and the secrets that
// are generated into the data directory for local use.
//
// The names of the settings are a stable interface for operators and
// scripts (the README's Configuration table lists them): every setting is
// a flag of `bulwark serve` and an environment variable, and the two always
// carry the same name (--data-dir and BULWARK_DATA_DIR).
//
// Typical use:
//
//	cfg := config.DefaultConfig()
//	cfg.RegisterFlags(fs) // env values become the flags' defaults
//	_ = fs.Parse(args)
//	if err := cfg.Finalize(); err != nil { ... } // derived defaults + Validate
//	ln, err := net.Listen("tcp", cfg.Listen)
//	err = cfg.Bound(ln.Addr().String()) // the real port, for a derived host name
//	generated, err := cfg.EnsureSecrets()
//
// Whether the host name is local (IsLocalHost: localhost, *.test, private
// addresses) decides the defaults that make a development machine safe and
// a public server strict: a local one gets a development PLC directory in
// the server (DevPLC) and open sign-up, a public one plc.directory and
// invites; a public PLC directory never gets a plain-http server URL.
package config
