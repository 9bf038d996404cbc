//go:build race

package repo_test

const raceEnabled = true
