//go:build !race

package firehose_test

const raceEnabled = false
