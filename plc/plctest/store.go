package plctest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	didplc "github.com/did-method-plc/go-didplc"
)

// Store keeps a directory's operation logs. Directory verifies every
// operation before it reaches Append, and serialises its own calls; a
// store shared by several directories (Postgres, behind several servers)
// settles races between them with ErrConflict.
type Store interface {
	// Log returns did's entries, oldest first; none for an unknown DID.
	Log(ctx context.Context, did string) ([]didplc.LogEntry, error)
	// Append stores entry as entry number n (from 0) of its DID's log.
	// It fails with ErrConflict, storing nothing, when the log does not
	// hold exactly n entries: another writer got there first.
	Append(ctx context.Context, n int, entry didplc.LogEntry) error
	// Count returns how many DIDs the store holds.
	Count(ctx context.Context) (int, error)
}

// MemoryStore keeps logs in memory and, when opened with OpenFileStore,
// appends each entry to a JSON-lines file as well.
type MemoryStore struct {
	mu   sync.Mutex
	logs map[string][]didplc.LogEntry
	file *os.File // nil: memory only
}

// NewMemoryStore returns an empty store that lives as long as the process.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{logs: map[string][]didplc.LogEntry{}}
}

// OpenFileStore returns a store persisted to path (JSON lines, one log
// entry each, appended as operations are accepted), loaded with what the
// file already holds. Close it when done.
func OpenFileStore(path string) (*MemoryStore, error) {
	s := NewMemoryStore()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e didplc.LogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		s.logs[e.DID] = append(s.logs[e.DID], e)
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return nil, err
	}
	s.file = f
	return s, nil
}

// Log implements Store.
func (s *MemoryStore) Log(_ context.Context, did string) ([]didplc.LogEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]didplc.LogEntry(nil), s.logs[did]...), nil
}

// Append implements Store.
func (s *MemoryStore) Append(_ context.Context, n int, entry didplc.LogEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.logs[entry.DID]) != n {
		return fmt.Errorf("%w: %s has %d operations, not %d", ErrConflict, entry.DID, len(s.logs[entry.DID]), n)
	}
	if s.file != nil {
		b, err := json.Marshal(&entry)
		if err != nil {
			return err
		}
		if _, err := s.file.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	s.logs[entry.DID] = append(s.logs[entry.DID], entry)
	return nil
}

// Count implements Store.
func (s *MemoryStore) Count(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.logs), nil
}

// Close closes the backing file, if any.
func (s *MemoryStore) Close() error {
	if s.file != nil {
		return s.file.Close()
	}
	return nil
}
