package config

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
)

// SecretsDir is the directory under the data dir that holds generated
// secrets. It is separate from the data dir itself because the data dir must
// stay traversable by the Postgres user when Bulwark runs as root, while
// secrets must be readable by Bulwark alone.
const SecretsDir = "secrets"

// The files EnsureSecrets keeps under SecretsDir, one secret each.
const (
	AdminPasswordFile = "admin-password"
	JWTSecretFile     = "jwt-secret"
	RotationKeyFile   = "plc-rotation-key"
)

const dataDirPermissions = 0o711

// SecretFile is a secret EnsureSecrets keeps in the data dir because the
// configuration did not set it.
type SecretFile struct {
	// Flag names the setting (admin-password).
	Flag string
	// Path is the file's absolute path.
	Path string
}

// SecretFiles lists the secrets that EnsureSecrets read from, or
// generated into, the data dir: where an operator finds the admin
// password of a server started without one.
func (c *Config) SecretFiles() []SecretFile {
	return append([]SecretFile(nil), c.secretFiles...)
}

// EnsureSecrets makes local use work without configuring secrets: each of the
// admin password, JWT secret and PLC rotation key that is unset is read from
// <data-dir>/secrets, or generated there on first use (file mode 0600,
// directory 0700) and reused on every later start. It returns the flag names
// of the secrets it generated just now, so that the caller can log that
// (never the values). Production should set all three explicitly and keep
// them somewhere safer than the data directory.
func (c *Config) EnsureSecrets() (generated []string, err error) {
	if c.AdminPassword != "" && c.JWTSecret != "" && c.PLCRotationKey != "" {
		return nil, nil
	}
	if c.DataDir == "" {
		return nil, settingError("data-dir", "must not be empty")
	}
	// 0711 lets an unprivileged Postgres user reach <data-dir>/postgres
	// without being able to list the directory.
	if err := os.MkdirAll(c.DataDir, dataDirPermissions); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	dir := filepath.Join(c.DataDir, SecretsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create secrets dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("secrets dir: %w", err)
	}

	items := []struct {
		flag  string
		file  string
		field *string
		gen   func() (string, error)
		check func(string) error
	}{
		{"admin-password", AdminPasswordFile, &c.AdminPassword, func() (string, error) { return randomHex(24) }, checkAdminPassword},
		{"jwt-secret", JWTSecretFile, &c.JWTSecret, func() (string, error) { return randomHex(32) }, nil},
		{"plc-rotation-key", RotationKeyFile, &c.PLCRotationKey, generateRotationKey, func(s string) error {
			_, err := ParseRotationKey(s)
			return err
		}},
	}
	for _, it := range items {
		if *it.field != "" {
			continue
		}
		path := filepath.Join(dir, it.file)
		val, created, err := readOrCreateSecret(path, it.gen)
		if err != nil {
			return generated, settingError(it.flag, "%v", err)
		}
		if it.check != nil {
			if err := it.check(val); err != nil {
				return generated, settingError(it.flag, "%s: %v", path, err)
			}
		}
		*it.field = val
		c.secretFiles = append(c.secretFiles, SecretFile{Flag: it.flag, Path: path})
		if created {
			generated = append(generated, it.flag)
		}
	}
	return generated, nil
}

// readOrCreateSecret returns the secret stored at path, creating it first
// when absent. The file is written under a temporary name and then linked
// into place, so that a crash never leaves a half-written secret and two
// processes starting at once agree on one value (the loser of the link reads
// the winner's).
func readOrCreateSecret(path string, gen func() (string, error)) (val string, created bool, err error) {
	if val, err := readSecret(path); err == nil {
		return val, false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, err
	}
	val, err = gen()
	if err != nil {
		return "", false, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", false, err
	}
	if _, err := tmp.WriteString(val + "\n"); err != nil {
		tmp.Close()
		return "", false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", false, err
	}
	if err := tmp.Close(); err != nil {
		return "", false, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			val, err := readSecret(path)
			return val, false, err
		}
		return "", false, err
	}
	return val, true, nil
}

func readSecret(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return "", err
		}
		return "", fmt.Errorf("%s is empty: delete it to generate a new one", path)
	}
	val := strings.TrimSpace(sc.Text())
	if val == "" {
		return "", fmt.Errorf("%s is empty: delete it to generate a new one", path)
	}
	return val, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func generateRotationKey() (string, error) {
	k, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return "", err
	}
	return k.Multibase(), nil
}

// ParseRotationKey parses a K-256 private key written as 64 hex digits or as
// multibase (the form `goat key generate` prints and EnsureSecrets stores).
func ParseRotationKey(s string) (*atcrypto.PrivateKeyK256, error) {
	s = strings.TrimSpace(s)
	if len(s) == 64 {
		if raw, err := hex.DecodeString(s); err == nil {
			k, err := atcrypto.ParsePrivateBytesK256(raw)
			if err != nil {
				return nil, fmt.Errorf("not a K-256 private key: %w", err)
			}
			return k, nil
		}
	}
	k, err := atcrypto.ParsePrivateMultibase(s)
	if err != nil {
		return nil, fmt.Errorf("want a K-256 private key as hex or multibase: %w", err)
	}
	k256, ok := k.(*atcrypto.PrivateKeyK256)
	if !ok {
		return nil, fmt.Errorf("want a K-256 key, got %T", k)
	}
	return k256, nil
}

// PLCRotationPrivateKey parses the configured rotation key.
func (c *Config) PLCRotationPrivateKey() (*atcrypto.PrivateKeyK256, error) {
	if c.PLCRotationKey == "" {
		return nil, settingError("plc-rotation-key", "not set (call EnsureSecrets first)")
	}
	return ParseRotationKey(c.PLCRotationKey)
}
