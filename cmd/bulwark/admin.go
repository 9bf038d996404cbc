package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/serverid"
)

// AdminNSIDPrefix is the namespace of Bulwark's own admin methods. The NSID
// authority io.github.bulwark-pds is the project's GitHub organisation
// (bulwark-pds.github.io), which the project controls.
const AdminNSIDPrefix = "io.github.bulwark-pds.admin."

// DefaultAdminURL is the URL of a server on the default listen address,
// from this machine.
const DefaultAdminURL = "http://" + config.DefaultListen

// adminTimeout bounds one admin call; repairs of a large firehose take a
// while, so it is generous.
const adminTimeout = 2 * time.Minute

// maxAdminResponse bounds an admin answer read into memory.
const maxAdminResponse = 64 << 20

// errHelp means help was asked for and printed: exit 0.
var errHelp = errors.New("help shown")

// noCommandError means no known command was named: exit 2 with the command
// list.
type noCommandError string

func (e noCommandError) Error() string { return string(e) }

// usageError is a mistake on the command line: exit 2 with the usage.
type usageError string

func (e usageError) Error() string { return string(e) }

// adminRun is one invocation of `bulwark admin`: how to reach the server,
// how to print, and where.
type adminRun struct {
	url      string
	password string
	dataDir  string
	json     bool
	stdout   io.Writer
	stderr   io.Writer

	// urlSet and dataDirSet report that the server's URL and data
	// directory were named (flag or environment), not defaulted.
	urlSet     bool
	dataDirSet bool

	// passwordFrom says where the password came from, for the hint on a
	// refused password.
	passwordFrom string
	client       *adminClient
}

// adminCommand is one leaf command: `bulwark admin <path> <args>`.
type adminCommand struct {
	path    string // "account info"
	args    string // "ACCOUNT --yes", as the usage shows it
	summary string
	run     func(ctx context.Context, a *adminRun, cmd *adminCommand, args []string) error
}

// adminGroups are the commands by group, in the order the usage lists
// them. A group with one command and no sub-name (audit, request-crawl)
// runs that command directly.
var adminGroups = []struct {
	name     string
	title    string
	commands []*adminCommand
}{
	{"account", "Accounts (ACCOUNT is a DID or a handle)", accountCommands},
	{"invite", "Invite codes", inviteCommands},
	{"request-crawl", "Relays", crawlCommands},
	{"firehose", "Firehose inspection and repair (each repair is transactional, idempotent\nand recorded in the audit log)", firehoseCommands},
	{"audit", "Audit log of every admin write", auditCommands},
}

func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &adminRun{
		url:        strings.TrimSpace(os.Getenv("BULWARK_ADMIN_URL")),
		dataDir:    envOr("BULWARK_DATA_DIR", config.DefaultDataDir),
		dataDirSet: os.Getenv("BULWARK_DATA_DIR") != "",
		stdout:     stdout,
		stderr:     stderr,
	}
	a.urlSet = a.url != ""
	err := a.main(ctx, args)
	var ue usageError
	var ge *groupUsageError
	var nc noCommandError
	switch {
	case errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ge):
		fmt.Fprintf(stderr, "bulwark admin: %s\n\n", ge.msg)
		groupUsage(stderr, ge.title, ge.cmds)
		return 2
	case errors.As(err, &nc):
		fmt.Fprintf(stderr, "bulwark admin: %s\n\n", nc)
		adminUsage(stderr)
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "bulwark admin: %s\n(\"bulwark admin COMMAND -h\" describes a command, \"bulwark admin -h\" lists them)\n", ue)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "bulwark admin: %v\n", err)
		return 1
	}
	return 0
}

// main parses the leading flags and runs the command they are followed by.
func (a *adminRun) main(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	a.commonFlags(fs)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			adminUsage(a.stdout)
			return errHelp
		}
		return noCommandError(err.Error())
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return noCommandError("no command")
	}
	if isHelp(rest[0]) {
		adminUsage(a.stdout)
		return errHelp
	}
	for _, g := range adminGroups {
		if g.name != rest[0] {
			continue
		}
		if len(g.commands) == 1 && g.commands[0].path == g.name {
			return g.commands[0].run(ctx, a, g.commands[0], rest[1:])
		}
		return a.runGroup(ctx, g.name, g.title, g.commands, rest[1:])
	}
	return noCommandError(fmt.Sprintf("unknown admin command %q", rest[0]))
}

// runGroup runs `bulwark admin <group> <command> ...`.
func (a *adminRun) runGroup(ctx context.Context, group, title string, cmds []*adminCommand, args []string) error {
	if len(args) > 0 && isHelp(args[0]) {
		groupUsage(a.stdout, title, cmds)
		return errHelp
	}
	if len(args) == 0 {
		return &groupUsageError{msg: group + " needs a command", title: title, cmds: cmds}
	}
	for _, c := range cmds {
		if c.path == group+" "+args[0] {
			return c.run(ctx, a, c, args[1:])
		}
	}
	return &groupUsageError{msg: fmt.Sprintf("unknown %s command %q", group, args[0]), title: title, cmds: cmds}
}

// groupUsageError is a usage mistake within a group: exit 2 with the
// group's usage rather than the whole command list.
type groupUsageError struct {
	msg   string
	title string
	cmds  []*adminCommand
}

func (e *groupUsageError) Error() string { return e.msg }

func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// commonFlags registers the connection and output flags on fs. Every
// command's flag set has them, so they may come before or after the
// command.
func (a *adminRun) commonFlags(fs *flag.FlagSet) {
	fs.Var(setFlag{&a.url, &a.urlSet}, "url", "server base `URL` [$BULWARK_ADMIN_URL; else the one the server of --data-dir recorded]")
	fs.Var(secretFlag{&a.password}, "admin-password", "admin `password` [$BULWARK_ADMIN_PASSWORD; else <data-dir>/secrets/admin-password]")
	fs.Var(setFlag{&a.dataDir, &a.dataDirSet}, "data-dir", "the server's data `directory`: where it records its address and identity, and its generated admin password [$BULWARK_DATA_DIR; else ./data]")
	fs.BoolVar(&a.json, "json", a.json, "print JSON instead of a table")
}

// setFlag is a string flag that records that it was given.
type setFlag struct {
	p   *string
	set *bool
}

func (f setFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}

func (f setFlag) Set(v string) error {
	*f.p, *f.set = v, true
	return nil
}

// secretFlag is a string flag whose value --help never shows.
type secretFlag struct{ p *string }

func (s secretFlag) String() string { return "" }
func (s secretFlag) Set(v string) error {
	*s.p = v
	return nil
}

// flags returns a flag set for cmd with the common flags on it.
func (a *adminRun) flags(cmd *adminCommand) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd.path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.commonFlags(fs)
	return fs
}

// parse parses args for cmd, flags and positional arguments in any order,
// and checks that exactly nargs positional arguments came (any number when
// nargs < 0). -h prints the command's usage and returns errHelp.
func (a *adminRun) parse(cmd *adminCommand, fs *flag.FlagSet, args []string, nargs int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				commandUsage(a.stdout, cmd, fs)
				return nil, errHelp
			}
			return nil, usageError(fmt.Sprintf("%s: %v", cmd.path, err))
		}
		rest := fs.Args()
		// A "--" ends the flags: everything after it is positional.
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if nargs >= 0 && len(pos) != nargs {
		return nil, usageError("usage: bulwark admin " + strings.TrimSpace(cmd.path+" "+cmd.args))
	}
	return pos, nil
}

func commandUsage(w io.Writer, cmd *adminCommand, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: bulwark admin %s\n\n%s\n\nFlags:\n", strings.TrimSpace(cmd.path+" "+cmd.args), cmd.summary)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

func groupUsage(w io.Writer, title string, cmds []*adminCommand) {
	fmt.Fprintf(w, "%s:\n", title)
	for _, c := range cmds {
		fmt.Fprintf(w, "  bulwark admin %s\n      %s\n", strings.TrimSpace(c.path+" "+c.args), c.summary)
	}
	fmt.Fprintln(w, "\nEvery command takes --url, --admin-password, --data-dir and --json (see bulwark admin -h).")
}

func adminUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: bulwark admin [flags] COMMAND [ARGS] [flags]

Administer a Bulwark server, local or remote, through its admin XRPC API
(HTTP Basic, user "admin"). "bulwark admin COMMAND -h" describes a command.

`)
	for _, g := range adminGroups {
		fmt.Fprintf(w, "%s:\n", g.title)
		for _, c := range g.commands {
			fmt.Fprintf(w, "  %s\n", strings.TrimSpace(c.path+" "+c.args))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, `Flags (before or after the command):
  --data-dir DIR         the server's data directory (default: $BULWARK_DATA_DIR,
                         else ./data): a running server records its address
                         and identity there, and the admin password it generated
  --url URL              the server (default: $BULWARK_ADMIN_URL, else the
                         address the server of --data-dir recorded)
  --admin-password PW    the admin password (default: $BULWARK_ADMIN_PASSWORD,
                         else the one generated in <data-dir>/secrets)
  --json                 print JSON instead of a table

The admin password goes only to the server of --data-dir, once it has
proved it is that server (a key it recorded there at start); with --url
and no record of a server in the data directory, to the URL as given.
Run with the server's environment (its EnvironmentFile) and every default
above is the server's own.
`)
}

// adminPassword resolves the admin password: --admin-password, else
// BULWARK_ADMIN_PASSWORD, else the file the server generated in the data
// dir. Only commands that need it ask.
func (a *adminRun) adminPassword() (string, error) {
	if a.password != "" {
		if a.passwordFrom == "" {
			a.passwordFrom = "--admin-password"
		}
		return a.password, nil
	}
	if v := strings.TrimSpace(os.Getenv("BULWARK_ADMIN_PASSWORD")); v != "" {
		a.password, a.passwordFrom = v, "BULWARK_ADMIN_PASSWORD"
		return v, nil
	}
	path := filepath.Join(a.dataDir, config.SecretsDir, "admin-password")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no admin password: pass --admin-password, set BULWARK_ADMIN_PASSWORD, or point --data-dir (BULWARK_DATA_DIR) at the server's data directory (%v)", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	a.password, a.passwordFrom = strings.TrimSpace(line), path
	if a.password == "" {
		return "", fmt.Errorf("no admin password: %s is empty", path)
	}
	return a.password, nil
}

// conn returns the client for the server: the one --url names, else the
// one the data directory records (locateServer).
func (a *adminRun) conn() (*adminClient, error) {
	if a.client != nil {
		return a.client, nil
	}
	c, err := a.locateServer()
	if err != nil {
		return nil, err
	}
	a.client = c
	return c, nil
}

// output prints v as indented JSON with --json, else calls text.
func (a *adminRun) output(v any, text func(w io.Writer) error) error {
	if a.json {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(append(b, '\n'))
		return err
	}
	return text(a.stdout)
}

// adminClient calls XRPC methods of a running server, with HTTP Basic admin
// credentials where a method needs them.
type adminClient struct {
	run  *adminRun
	base string
	http *http.Client
	// server is the data directory's record of the server base must
	// prove it is before the first request; nil when none is checked.
	server *serverid.Runtime
}

// call performs one Bulwark admin method (io.github.bulwark-pds.admin.*).
func (c *adminClient) call(ctx context.Context, method, name string, q url.Values, body, res any) error {
	return c.xrpc(ctx, method, AdminNSIDPrefix+name, q, body, res, true)
}

// xrpc performs one XRPC request and decodes the JSON answer into res (nil:
// ignore it); an XRPC error becomes an error carrying its name and message.
// admin sends the admin credentials.
func (c *adminClient) xrpc(ctx context.Context, method, nsid string, q url.Values, body, res any, admin bool) error {
	u := c.base + "/xrpc/" + nsid
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	if err := c.confirm(ctx); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if admin {
		pw, err := c.run.adminPassword()
		if err != nil {
			return err
		}
		req.SetBasicAuth("admin", pw)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the server at %s (is it running? --data-dir or --url names it): %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminResponse))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return c.xrpcError(nsid, resp.StatusCode, data, admin)
	}
	if res == nil || len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	return json.Unmarshal(data, res)
}

func (c *adminClient) xrpcError(nsid string, status int, data []byte, admin bool) error {
	var xe struct{ Error, Message string }
	if json.Unmarshal(data, &xe) != nil || xe.Error == "" {
		return fmt.Errorf("%s: HTTP %d: %s", nsid, status, bytes.TrimSpace(data))
	}
	err := fmt.Errorf("%s: %s (HTTP %d)", xe.Error, xe.Message, status)
	if admin && status == http.StatusUnauthorized {
		err = fmt.Errorf("%w; the server refused the admin password from %s", err, c.run.passwordFrom)
	}
	return err
}

func printJSON(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
