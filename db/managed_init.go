package db

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// serviceCredential resolves the account Postgres runs as under root.
func serviceCredential(name string) (*syscall.Credential, error) {
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("db: managed postgres: running as root, and Postgres refuses to run as root, but user %q does not exist (apt-get install postgresql creates it; or run bulwark as a normal user): %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("db: managed postgres: user %q has non-numeric ids", name)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	return cred, nil
}

// prepareDir creates dir for the server's user and, under root, checks that
// this user can reach it: a 0700 directory anywhere above (os.MkdirTemp,
// t.TempDir, a home directory) would make initdb fail with a vaguer error.
func (m *Managed) prepareDir(dir string) error {
	parentPerm := os.FileMode(0o700)
	if m.cred != nil {
		parentPerm = 0o711 // traversable, not listable, by the server's user
	}
	if err := os.MkdirAll(filepath.Dir(dir), parentPerm); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	if m.cred == nil {
		return nil
	}
	if err := os.Chown(dir, int(m.cred.Uid), int(m.cred.Gid)); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	return checkTraversable(dir, m.cred)
}

// checkTraversable returns an error naming the first directory above dir
// that cred may not search.
func checkTraversable(dir string, cred *syscall.Credential) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("db: managed postgres: %w", err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			perm := fi.Mode().Perm()
			var can bool
			switch {
			case st.Uid == cred.Uid:
				can = perm&0o100 != 0
			case st.Gid == cred.Gid || slices.Contains(cred.Groups, st.Gid):
				can = perm&0o010 != 0
			default:
				can = perm&0o001 != 0
			}
			if !can {
				return fmt.Errorf("db: managed postgres: directory %s (mode %04o) is not traversable by uid %d, which Postgres runs as because this process is root; it needs to reach %s: chmod o+x %s, or choose another directory",
					d, perm, cred.Uid, dir, d)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// socketDir picks the socket directory: the cluster directory when the
// socket path fits in sun_path, else a short directory under /tmp (not
// $TMPDIR, which may itself be long) named after a hash of the cluster
// directory, so a restart finds the same one.
func (m *Managed) socketDir() (string, error) {
	if len(m.dir)+1+len(socketName) <= sunPathMax && !strings.ContainsAny(m.dir, ", '\"\\") {
		return m.dir, nil
	}
	sum := sha256.Sum256([]byte(m.dir))
	d := filepath.Join("/tmp", "bulwark-pg-sock-"+hex.EncodeToString(sum[:6]))
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("db: managed postgres: socket directory: %w", err)
	}
	uid := uint32(os.Geteuid())
	if m.cred != nil {
		uid = m.cred.Uid
		if err := os.Chown(d, int(m.cred.Uid), int(m.cred.Gid)); err != nil {
			return "", fmt.Errorf("db: managed postgres: socket directory: %w", err)
		}
	}
	// A shared /tmp lets another user create this name first; the socket
	// is only as private as its directory, so refuse one we do not own.
	fi, err := os.Lstat(d)
	if err != nil {
		return "", fmt.Errorf("db: managed postgres: socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || (ok && st.Uid != uid) || fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("db: managed postgres: socket directory %s is not a private directory owned by uid %d", d, uid)
	}
	return d, nil
}

// initCluster creates the data directory on first run. It is built under
// a temporary name and renamed, so a data directory exists only complete.
func (m *Managed) initCluster(ctx context.Context, cfg ManagedConfig) error {
	if _, err := os.Stat(filepath.Join(m.dataDir, "PG_VERSION")); err == nil {
		return nil
	}
	if _, err := os.Stat(m.dataDir); err == nil {
		return fmt.Errorf("db: managed postgres: %s exists but holds no Postgres cluster; move it away", m.dataDir)
	}
	tmp := m.dataDir + ".init"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	start := time.Now()
	if cfg.InitCache != "" {
		src, err := m.cachedCluster(ctx, cfg)
		if err != nil {
			return err
		}
		// cp -a keeps ownership and modes, which Postgres checks, and is
		// faster than a walk in Go.
		if out, err := exec.CommandContext(ctx, "cp", "-a", src, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("db: managed postgres: copy cached cluster: %w: %s", err, out)
		}
	} else if err := m.initdb(ctx, tmp, cfg.Fast); err != nil {
		return err
	}
	if err := os.Rename(tmp, m.dataDir); err != nil {
		return fmt.Errorf("db: managed postgres: %w", err)
	}
	m.logger.Info("initialised postgres cluster", "duration", time.Since(start), "cached", cfg.InitCache != "")
	return nil
}

func (m *Managed) initdb(ctx context.Context, dataDir string, fast bool) error {
	args := []string{
		"-D", dataDir,
		"--username=" + managedSuperuser,
		// Trust only on the Unix socket; TCP is off, and would want a
		// password nobody has even if turned on.
		"--auth-local=trust", "--auth-host=scram-sha-256",
		// UTF8 with C collation: byte order, as atproto compares keys.
		"--encoding=UTF8", "--no-locale",
	}
	if fast {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(m.binDir, "initdb"), args...)
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = m.logFile, m.logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("db: managed postgres: initdb failed (see %s): %w\n%s", m.logFile.Name(), err, logTail(m.logFile.Name()))
	}
	return nil
}

// cachedCluster returns a pristine data directory from cfg.InitCache,
// running initdb into the cache first if needed. Concurrent processes may
// both run initdb; the first rename wins and the loser uses its result.
func (m *Managed) cachedCluster(ctx context.Context, cfg ManagedConfig) (string, error) {
	version, err := binVersion(ctx, m.binDir)
	if err != nil {
		return "", err
	}
	uid := os.Geteuid()
	if m.cred != nil {
		uid = int(m.cred.Uid)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%d|%t|v1", m.binDir, version, uid, cfg.Fast)))
	entry := filepath.Join(cfg.InitCache, "pg"+version+"-"+hex.EncodeToString(sum[:6]))
	data := filepath.Join(entry, managedDataDir)
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return data, nil
	}
	perm := os.FileMode(0o700)
	if m.cred != nil {
		perm = 0o711
	}
	if err := os.MkdirAll(cfg.InitCache, perm); err != nil {
		return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
	}
	removeStale(cfg.InitCache, filepath.Base(entry)+".tmp-*", time.Hour)
	staging, err := os.MkdirTemp(cfg.InitCache, filepath.Base(entry)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
	}
	defer os.RemoveAll(staging)
	if m.cred != nil {
		if err := os.Chown(staging, int(m.cred.Uid), int(m.cred.Gid)); err != nil {
			return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
		}
		if err := checkTraversable(staging, m.cred); err != nil {
			return "", err
		}
	}
	if err := m.initdb(ctx, filepath.Join(staging, managedDataDir), cfg.Fast); err != nil {
		return "", err
	}
	if err := os.Rename(staging, entry); err != nil {
		if _, statErr := os.Stat(filepath.Join(data, "PG_VERSION")); statErr != nil {
			return "", fmt.Errorf("db: managed postgres: init cache: %w", err)
		}
	}
	return data, nil
}

// removeStale deletes entries of dir matching pattern older than age:
// leftovers of processes killed half-way.
func removeStale(dir, pattern string, age time.Duration) {
	matches, _ := filepath.Glob(filepath.Join(dir, pattern))
	for _, p := range matches {
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > age {
			_ = os.RemoveAll(p)
		}
	}
}
