package oauth

import "time"

// AgeSets makes every cached permission set (and failure) d older, as if
// that much time had passed for the cache alone.
func (s *Server) AgeSets(d time.Duration) {
	s.sets.mu.Lock()
	defer s.sets.mu.Unlock()
	for _, e := range s.sets.items {
		e.resolved = e.resolved.Add(-d)
		e.tried = e.tried.Add(-d)
	}
}

// SetCacheStats is what the permission set cache holds: entries and the
// bytes they are charged.
func (s *Server) SetCacheStats() (entries, bytes int) {
	s.sets.mu.Lock()
	defer s.sets.mu.Unlock()
	return len(s.sets.items), s.sets.bytes
}

// Bounds of the permission set cache, for tests that fill it.
const (
	MaxCachedSets     = maxCachedSets
	MaxSetCacheBytes  = maxSetCacheBytes
	MaxSetResolutions = maxSetResolutions
	SetFreshFor       = setFreshFor
	SetUsableFor      = setUsableFor
	SetFailureTTL     = setFailureTTL
)
