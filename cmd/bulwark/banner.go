package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/serverid"
)

// startInfo is what the start banner tells an operator: where the server
// is, where its secrets are, which PLC directory it uses, who may sign up,
// and the command that makes the first account.
type startInfo struct {
	// Program is how the operator invoked bulwark (os.Args[0]).
	Program string
	// URL is the base URL clients use (the public URL).
	URL string
	// DataDir is the data directory, absolute.
	DataDir string
	// DefaultDataDir is the data directory `bulwark admin` assumes
	// (./data from where it runs), absolute.
	DefaultDataDir string
	// DevPLC reports a development PLC directory in this server.
	DevPLC bool
	// PLCURL is the PLC directory in use.
	PLCURL string
	// InviteRequired reports that sign-up needs an invite code.
	InviteRequired bool
	// SecretFiles are the secrets kept in the data dir.
	SecretFiles []config.SecretFile
	// HandleDomain is the first handle suffix users may register under.
	HandleDomain string
	// HasAccounts reports that the server hosts an account already: the
	// banner then points at the accounts instead of making a first one.
	HasAccounts bool
}

// newStartInfo gathers the banner's facts from a configuration that has
// been finalized, bound and given its secrets, and from its database.
func newStartInfo(ctx context.Context, cfg *config.Config, q db.DBTX) (startInfo, error) {
	hasAccounts, err := serverid.HasAccounts(ctx, q)
	if err != nil {
		return startInfo{}, err
	}
	info := startInfoFor(cfg)
	info.HasAccounts = hasAccounts
	return info, nil
}

// startInfoFor is the banner's facts that the configuration alone gives.
func startInfoFor(cfg *config.Config) startInfo {
	defData, _ := filepath.Abs(config.DefaultDataDir)
	info := startInfo{
		Program:        programName(),
		URL:            cfg.PublicURL(),
		DataDir:        cfg.DataDir,
		DefaultDataDir: defData,
		DevPLC:         cfg.DevPLC,
		PLCURL:         cfg.PLCURL,
		InviteRequired: cfg.InviteRequired,
		SecretFiles:    cfg.SecretFiles(),
	}
	if len(cfg.HandleDomains) > 0 {
		info.HandleDomain = cfg.HandleDomains[0]
	}
	return info
}

// programName is the command that runs this binary again: the path it was
// started by when that has a slash (./bin/bulwark), else "bulwark".
func programName() string {
	if len(os.Args) > 0 && strings.Contains(os.Args[0], "/") && !strings.HasSuffix(os.Args[0], ".test") {
		return os.Args[0]
	}
	return "bulwark"
}

// adminURL is the URL of a server listening on listen, as seen from the
// same machine: a wildcard address is reached through loopback; no (or an
// unusable) listen address is DefaultAdminURL.
func adminURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return DefaultAdminURL
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// adminCommand is `bulwark admin` as it finds this server: through the
// data directory, named when it is not the one `bulwark admin` assumes.
func (i startInfo) adminCommand() string {
	cmd := i.Program + " admin"
	if i.DataDir != i.DefaultDataDir {
		cmd += " --data-dir " + shellQuote(i.DataDir)
	}
	return cmd
}

// firstAccountCommand is the command line that creates the first account
// on this server, as printed.
func (i startInfo) firstAccountCommand() string {
	return fmt.Sprintf("%s account create --handle alice%s --email alice@example.com", i.adminCommand(), i.HandleDomain)
}

// accountsLine is the banner's last line: the command that makes the
// first account, or, once there are accounts, the one that lists them.
func (i startInfo) accountsLine() (label, text string) {
	if !i.HasAccounts {
		return "First account:", i.firstAccountCommand()
	}
	return "Accounts:", i.adminCommand() + " account list (account create --handle NAME --email ADDRESS adds one)"
}

// adminPasswordFile is where the admin password is kept, or "" when the
// configuration sets it.
func (i startInfo) adminPasswordFile() string {
	for _, f := range i.SecretFiles {
		if f.Flag == "admin-password" {
			return f.Path
		}
	}
	return ""
}

// plcLine says which PLC directory the server uses.
func (i startInfo) plcLine() string {
	if i.DevPLC {
		return "development PLC at " + i.PLCURL + " (in this server; its DIDs exist nowhere else)"
	}
	return i.PLCURL
}

// secretsLine says where the admin password and the other generated
// secrets are.
func (i startInfo) secretsLine() string {
	pw := i.adminPasswordFile()
	var others []string
	for _, f := range i.SecretFiles {
		if f.Flag != "admin-password" {
			others = append(others, filepath.Base(f.Path))
		}
	}
	var b strings.Builder
	if pw != "" {
		b.WriteString("admin password in " + pw)
	} else {
		b.WriteString("admin password from BULWARK_ADMIN_PASSWORD")
	}
	if len(others) > 0 {
		dir := filepath.Dir(i.SecretFiles[0].Path)
		fmt.Fprintf(&b, "; %s in %s", strings.Join(others, ", "), dir)
	}
	return b.String()
}

// signupLine says whether creating an account needs an invite code.
func (i startInfo) signupLine() string {
	if i.InviteRequired {
		return "invite code required (BULWARK_INVITE_REQUIRED; the command below mints one)"
	}
	return "open, no invite code needed (BULWARK_INVITE_REQUIRED=true to change)"
}

// bannerText is the start banner: a few plain lines for a person reading
// the terminal. The same facts go to the log (logAttrs).
func bannerText(i startInfo) string {
	label, accounts := i.accountsLine()
	return fmt.Sprintf(`
Bulwark is ready.
  URL:            %s
  PLC directory:  %s
  Sign-up:        %s
  Secrets:        %s
  %-15s %s
All settings: %s config (same flags and BULWARK_* variables as serve).

`, i.URL, i.plcLine(), i.signupLine(), i.secretsLine(), label, accounts, i.Program)
}

// logAttrs are the banner's facts as log attributes.
func (i startInfo) logAttrs() []any {
	return []any{
		"url", i.URL, "plc", i.plcLine(), "invite_required", i.InviteRequired,
		"secrets", i.secretsLine(), "has_accounts", i.HasAccounts, "admin", i.adminCommand(),
	}
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == ':' || r == '+' || r == ',' || r == '=' || r == '@' ||
			('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
