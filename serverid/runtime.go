package serverid

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RuntimeFile is the file a running server keeps in its data directory.
const RuntimeFile = "server.json"

// LockFile is the data directory's lock, held by the server using it.
const LockFile = "bulwark.lock"

// maxRuntimeBytes bounds the runtime file read back.
const maxRuntimeBytes = 64 << 10

// Runtime is what a running server tells the programs of its machine
// about itself.
type Runtime struct {
	// PID is the server's process id, for messages.
	PID int `json:"pid"`
	// AdminURL is where the server is reached from this machine (its
	// listen address, a wildcard host replaced by loopback).
	AdminURL string `json:"adminURL"`
	// PublicURL is the base URL clients use.
	PublicURL string `json:"publicURL"`
	// DID is the server's service DID.
	DID string `json:"did"`
	// Instance is a random id of this start of the server.
	Instance string `json:"instance"`
	// Key is the hex proof key of this start (Proof); it never leaves
	// the machine.
	Key string `json:"key"`
	// Started is when the server wrote the file.
	Started time.Time `json:"started"`
}

// NewRuntime is the runtime record of a server starting now, with a fresh
// instance id and proof key.
func NewRuntime(adminURL, publicURL, did string) Runtime {
	return Runtime{
		PID:       os.Getpid(),
		AdminURL:  adminURL,
		PublicURL: publicURL,
		DID:       did,
		Instance:  rand.Text(),
		Key:       hex.EncodeToString(randomBytes(32)),
		Started:   time.Now().UTC().Truncate(time.Second),
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

// Write writes r into dataDir, readable by its owner only, replacing any
// previous file at once (a reader sees the old file or the new one).
func (r Runtime) Write(dataDir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dataDir, "."+RuntimeFile+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", RuntimeFile, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", RuntimeFile, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", RuntimeFile, err)
	}
	return os.Rename(tmp.Name(), filepath.Join(dataDir, RuntimeFile))
}

// Remove deletes the runtime file of dataDir if it is still r's (a server
// that took over the directory since keeps its own).
func (r Runtime) Remove(dataDir string) error {
	cur, err := ReadRuntime(dataDir)
	if err != nil || cur.Instance != r.Instance {
		return nil
	}
	return os.Remove(filepath.Join(dataDir, RuntimeFile))
}

// ErrNoRuntime means the data directory has no runtime file: no server
// has started on it, or the last one stopped.
var ErrNoRuntime = errors.New("no running server recorded")

// ReadRuntime reads the runtime file of dataDir.
func ReadRuntime(dataDir string) (*Runtime, error) {
	path := filepath.Join(dataDir, RuntimeFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist", ErrNoRuntime, path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r Runtime
	if err := json.NewDecoder(io.LimitReader(f, maxRuntimeBytes)).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.AdminURL == "" || r.Instance == "" || len(r.Key) != 64 {
		return nil, fmt.Errorf("%s: incomplete", path)
	}
	return &r, nil
}

// Lock takes dataDir's lock, failing at once when another process holds
// it. The kernel drops the lock when the process ends, however it ends;
// release drops it sooner.
func Lock(dataDir string) (release func(), err error) {
	path := filepath.Join(dataDir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 32))
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another bulwark server (pid %s): one server per data directory; stop it, or give this one another --data-dir",
				dataDir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	// The pid is for the message above; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil
}
