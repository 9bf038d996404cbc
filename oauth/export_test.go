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

// Bounds and lifetimes of the permission set cache.
const (
	MaxSetResolutions = maxSetResolutions
	SetFreshFor       = setFreshFor
	SetUsableFor      = setUsableFor
	SetFailureTTL     = setFailureTTL
)
