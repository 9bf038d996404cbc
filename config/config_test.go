package config

import (
	"bytes"
	"encoding/hex"
	"flag"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/stretchr/testify/require"
)

// parse builds a Config from env and args the way `bulwark serve` does.
func parse(t *testing.T, env map[string]string, args ...string) (*Config, error) {
	t.Helper()
	c := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.registerFlags(fs, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	return c, c.Finalize()
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:2583", c.Listen)
	require.Equal(t, "localhost:2583", c.Hostname, "derived from the listen port")
	require.Equal(t, []string{".test"}, c.HandleDomains, ".localhost handles are refused across the network")
	require.True(t, filepath.IsAbs(c.DataDir))
	require.Equal(t, filepath.Join(c.DataDir, "blobs"), c.BlobDir)
	require.True(t, c.DevPLC, "a local host name runs its own PLC")
	require.Equal(t, "http://localhost:2583", c.PLCURL)
	require.Equal(t, Rate{Count: 1, Per: time.Minute}, c.FirehoseRate)
	require.Equal(t, 5, c.FirehoseBurst)
	require.Equal(t, 72*time.Hour, c.FirehoseRetention)
	require.Equal(t, int64(2097152), c.MaxJSONBody)
	require.False(t, c.InviteRequired)
	require.GreaterOrEqual(t, c.InflightBudget, int64(64<<20))
	require.Equal(t, "did:web:localhost%3A2583", c.ServiceDID())
	require.Equal(t, "http://localhost:2583", c.PublicURL())
}

func TestPrecedence(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"BULWARK_LISTEN":          "0.0.0.0:9000",
		"BULWARK_HOSTNAME":        "pds.example.com",
		"BULWARK_HANDLE_DOMAINS":  ".example.com, .example.org,",
		"BULWARK_FIREHOSE_RATE":   "10/h",
		"BULWARK_INVITE_REQUIRED": "true",
		"BULWARK_TRUSTED_PROXIES": "10.0.0.0/8,192.168.1.7",
		"BULWARK_INFLIGHT_BUDGET": "512MiB",
		"BULWARK_LOG_LEVEL":       "debug",
	}
	c, err := parse(t, env, "--listen", "127.0.0.1:9001")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9001", c.Listen, "a flag overrides the environment")
	require.Equal(t, "pds.example.com", c.Hostname)
	require.Equal(t, []string{".example.com", ".example.org"}, c.HandleDomains)
	require.Equal(t, Rate{Count: 10, Per: time.Hour}, c.FirehoseRate)
	require.True(t, c.InviteRequired)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32")}, c.TrustedProxies)
	require.Equal(t, int64(512<<20), c.InflightBudget)
	require.Equal(t, slog.LevelDebug, c.LogLevel)
	require.Equal(t, "did:web:pds.example.com", c.ServiceDID())
	require.Equal(t, "https://pds.example.com", c.PublicURL())
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // substring of the error: the setting's name
	}{
		{"listen without port", nil, []string{"--listen", "127.0.0.1"}, "--listen"},
		{"listen bad port", nil, []string{"--listen", "127.0.0.1:99999"}, "--listen"},
		{"hostname with scheme", nil, []string{"--hostname", "https://pds.example.com"}, "--hostname"},
		{"hostname with underscore", nil, []string{"--hostname", "pds_1.example.com"}, "--hostname"},
		{"hostname bad port", nil, []string{"--hostname", "localhost:0"}, "--hostname"},
		{"plc url not http", nil, []string{"--plc-url", "ftp://plc.example"}, "--plc-url"},
		{"plc url relative", nil, []string{"--plc-url", "plc.directory"}, "--plc-url"},
		{"handle domain without dot", nil, []string{"--handle-domains", "example.com"}, "--handle-domains"},
		{"handle domain invalid", nil, []string{"--handle-domains", ".exa mple.com"}, "--handle-domains"},
		{"crawler not a url", nil, []string{"--crawlers", "bsky.network"}, "--crawlers"},
		{"appview did missing", nil, []string{"--appview-did", ""}, "--appview-url"},
		{"appview did bad", nil, []string{"--appview-did", "api.bsky.app"}, "--appview-did"},
		{"short jwt secret", nil, []string{"--jwt-secret", "changeme"}, "--jwt-secret"},
		{"bad rotation key", nil, []string{"--plc-rotation-key", "zzzz"}, "--plc-rotation-key"},
		{"bad log format", nil, []string{"--log-format", "xml"}, "--log-format"},
		{"bad email", nil, []string{"--contact-email", "nobody"}, "--contact-email"},
		{"bad tos url", nil, []string{"--terms-of-service-url", "example.com/tos"}, "--terms-of-service-url"},
		{"metrics on the public port", nil, []string{"--metrics-listen", "127.0.0.1:2583"}, "--metrics-listen"},
		{"burst zero", nil, []string{"--firehose-burst", "0"}, "--firehose-burst"},
		{"bad database url", nil, []string{"--database-url", "postgres://u:secretpw@host:notaport/db"}, "--database-url"},
		{"env bad CIDR", map[string]string{"BULWARK_TRUSTED_PROXIES": "10.0.0.0/33"}, nil, "BULWARK_TRUSTED_PROXIES"},
		{"env bad rate", map[string]string{"BULWARK_FIREHOSE_RATE": "fast"}, nil, "BULWARK_FIREHOSE_RATE"},
		{"env bad bool", map[string]string{"BULWARK_INVITE_REQUIRED": "perhaps"}, nil, "BULWARK_INVITE_REQUIRED"},
		{"env bad duration", map[string]string{"BULWARK_FIREHOSE_RETENTION": "3 days"}, nil, "BULWARK_FIREHOSE_RETENTION"},
		{"flag bad size", nil, []string{"--max-json-body", "lots"}, "max-json-body"},
		{"flag bad CIDR", nil, []string{"--trusted-proxies", "nope"}, "trusted-proxies"},
		{"postgres setting without value", nil, []string{"--postgres-settings", "shared_buffers"}, "--postgres-settings"},
		{"postgres setting name with a space", nil, []string{"--postgres-settings", "shared_buffers -c fsync=off"}, "--postgres-settings"},
		{"env postgres setting name", map[string]string{"BULWARK_POSTGRES_SETTINGS": "work-mem=4MB"}, nil, "--postgres-settings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(t, tt.env, tt.args...)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "secretpw")
		})
	}
}

func TestHostnameForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		hostname, did, url string
		domains            []string
	}{
		{"localhost:2583", "did:web:localhost%3A2583", "http://localhost:2583", []string{".test"}},
		{"pds.localhost", "did:web:pds.localhost", "http://pds.localhost", []string{".test"}},
		{"10.0.0.7", "did:web:10.0.0.7", "http://10.0.0.7", []string{".test"}},
		{"pds.example.com", "did:web:pds.example.com", "https://pds.example.com", []string{".pds.example.com"}},
		{"PDS.Example.COM", "did:web:pds.example.com", "https://pds.example.com", []string{".pds.example.com"}},
		{"pds.example.com:8443", "did:web:pds.example.com%3A8443", "http://pds.example.com:8443", []string{".pds.example.com"}}, // with a local PLC below
		{"dev.test", "did:web:dev.test", "http://dev.test", []string{".dev.test"}},
		{"127.0.0.1:2583", "did:web:127.0.0.1%3A2583", "http://127.0.0.1:2583", nil},
		{"pds.internal:2583", "did:web:pds.internal%3A2583", "http://pds.internal:2583", []string{".test"}},
	}
	for _, tt := range tests {
		t.Run(tt.hostname, func(t *testing.T) {
			t.Parallel()
			args := []string{"--hostname", tt.hostname}
			if tt.hostname == "pds.example.com:8443" || tt.hostname == "pds.internal:2583" { // public names over http need a local PLC
				args = append(args, "--plc-url", "http://127.0.0.1:2582")
			}
			if tt.domains == nil {
				args = append(args, "--handle-domains", ".test")
			}
			c, err := parse(t, nil, args...)
			require.NoError(t, err)
			require.Equal(t, tt.did, c.ServiceDID())
			require.Equal(t, tt.url, c.PublicURL())
			if tt.domains != nil {
				require.Equal(t, tt.domains, c.HandleDomains)
			}
		})
	}
}

func TestRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Rate
		perSec  float64
		wantErr bool
	}{
		{in: "1/min", want: Rate{1, time.Minute}, perSec: 1.0 / 60},
		{in: "5/s", want: Rate{5, time.Second}, perSec: 5},
		{in: "30/h", want: Rate{30, time.Hour}, perSec: 30.0 / 3600},
		{in: "1/30s", want: Rate{1, 30 * time.Second}, perSec: 1.0 / 30},
		{in: "0/min", wantErr: true},
		{in: "1", wantErr: true},
		{in: "1/fortnight", wantErr: true},
		{in: "-1/s", wantErr: true},
	}
	for _, tt := range tests {
		var r Rate
		err := r.Set(tt.in)
		if tt.wantErr {
			require.Error(t, err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, r)
		require.InDelta(t, tt.perSec, float64(r.Limit()), 1e-9)
		var again Rate
		require.NoError(t, again.Set(r.String()), "String output parses back")
		require.Equal(t, r, again)
	}
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{in: "1048576", want: 1 << 20},
		{in: "2MiB", want: 2 << 20},
		{in: "512 KiB", want: 512 << 10},
		{in: "1gb", want: 1 << 30},
		{in: "-1", err: true},
		{in: "1.5MiB", err: true},
		{in: "", err: true},
	}
	for _, tt := range tests {
		var b byteSize
		err := b.Set(tt.in)
		if tt.err {
			require.Error(t, err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, int64(b), tt.in)
	}
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"postgres://bulwark:hunter2@db:5432/bulwark?sslmode=disable", "postgres://bulwark:xxxxx@db:5432/bulwark?sslmode=disable"},
		{"postgres://db/bulwark?password=hunter2&sslmode=disable", "postgres://db/bulwark?password=xxxxx&sslmode=disable"},
		{"host=db user=bulwark password=hunter2 dbname=bulwark", "host=db user=bulwark password=xxxxx dbname=bulwark"},
		{"host=db password='hun ter2' dbname=bulwark", "host=db password=xxxxx dbname=bulwark"},
		{"postgres:///bulwark?host=/tmp/sock", "postgres:///bulwark?host=/tmp/sock"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, RedactDatabaseURL(tt.in))
	}

	c, err := parse(t, nil,
		"--admin-password", "adminhunter2-long-enough",
		"--jwt-secret", strings.Repeat("j", 40),
		"--database-url", "postgres://bulwark:dbhunter2@db/bulwark",
	)
	require.NoError(t, err)
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	out := buf.String()
	require.NotContains(t, out, "hunter2")
	require.NotContains(t, out, strings.Repeat("j", 40))
	require.Contains(t, out, `"admin-password":"(redacted)"`)
	require.Contains(t, out, `"listen":"127.0.0.1:2583"`)
	require.Equal(t, "adminhunter2-long-enough", c.AdminPassword, "redaction works on a copy")
}

func TestEnsureSecrets(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")

	load := func() (*Config, []string) {
		c, err := parse(t, nil, "--data-dir", dir)
		require.NoError(t, err)
		gen, err := c.EnsureSecrets()
		require.NoError(t, err)
		require.NoError(t, c.Validate())
		return c, gen
	}
	first, gen := load()
	require.ElementsMatch(t, []string{"admin-password", "jwt-secret", "plc-rotation-key"}, gen)
	require.Len(t, first.SecretFiles(), 3)
	require.GreaterOrEqual(t, len(first.JWTSecret), MinJWTSecretLen)
	_, err := first.PLCRotationPrivateKey()
	require.NoError(t, err)

	st, err := os.Stat(filepath.Join(dir, SecretsDir))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	for _, f := range []string{AdminPasswordFile, JWTSecretFile, RotationKeyFile} {
		st, err := os.Stat(filepath.Join(dir, SecretsDir, f))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f)
	}

	second, gen := load()
	require.Empty(t, gen, "secrets are generated once")
	require.Equal(t, first.AdminPassword, second.AdminPassword)
	require.Equal(t, first.JWTSecret, second.JWTSecret)
	require.Equal(t, first.PLCRotationKey, second.PLCRotationKey)

	// A secret set in the configuration wins over the file.
	c, err := parse(t, nil, "--data-dir", dir, "--admin-password", "explicit-admin-password")
	require.NoError(t, err)
	gen, err = c.EnsureSecrets()
	require.NoError(t, err)
	require.Empty(t, gen)
	require.Equal(t, "explicit-admin-password", c.AdminPassword)
	require.Equal(t, []SecretFile{
		{"jwt-secret", filepath.Join(dir, SecretsDir, JWTSecretFile)},
		{"plc-rotation-key", filepath.Join(dir, SecretsDir, RotationKeyFile)},
	}, c.SecretFiles(), "only the secrets kept in the data dir")

	// A damaged file is an error naming the setting, not a silent new key.
	require.NoError(t, os.WriteFile(filepath.Join(dir, SecretsDir, RotationKeyFile), []byte("garbage\n"), 0o600))
	c, err = parse(t, nil, "--data-dir", dir)
	require.NoError(t, err)
	_, err = c.EnsureSecrets()
	require.ErrorContains(t, err, "--plc-rotation-key")
}

func TestParseRotationKey(t *testing.T) {
	t.Parallel()
	k, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)

	fromHex, err := ParseRotationKey(hex.EncodeToString(k.Bytes()))
	require.NoError(t, err)
	require.True(t, k.Equal(fromHex))

	fromMB, err := ParseRotationKey(k.Multibase())
	require.NoError(t, err)
	require.True(t, k.Equal(fromMB))

	p, err := atcrypto.GeneratePrivateKeyP256()
	require.NoError(t, err)
	_, err = ParseRotationKey(p.Multibase())
	require.Error(t, err, "a P-256 key is refused")
}

func TestHelpHidesSecrets(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	env := map[string]string{
		"BULWARK_JWT_SECRET":   "envjwtsecret-envjwtsecret-envjwtsecret",
		"BULWARK_DATABASE_URL": "postgres://u:envdbpw@db/bulwark",
	}
	c.registerFlags(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.PrintDefaults()
	require.NotContains(t, help.String(), "envjwtsecret")
	require.NotContains(t, help.String(), "envdbpw")
	require.Contains(t, help.String(), "BULWARK_JWT_SECRET")
}

func TestEmptyEnvIsUnset(t *testing.T) {
	t.Parallel()
	c, err := parse(t, map[string]string{"BULWARK_FIREHOSE_RATE": "", "BULWARK_HANDLE_DOMAINS": " ", "BULWARK_LISTEN": ""})
	require.NoError(t, err)
	require.Equal(t, DefaultFirehoseRate, c.FirehoseRate)
	require.Equal(t, DefaultListen, c.Listen)
	require.Equal(t, []string{".test"}, c.HandleDomains)
}
