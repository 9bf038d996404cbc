//go:build race

package firehose_test

// raceEnabled: the race detector makes sync.Pool drop what is put back,
// so allocation counts mean nothing under it.
const raceEnabled = true
