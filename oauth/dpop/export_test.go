package dpop

// ReplayLen reports how many proof ids v remembers.
func ReplayLen(v *Verifier) int { return v.replay.len() }
