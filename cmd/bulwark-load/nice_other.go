//go:build !linux

package main

import (
	"errors"
	"os/exec"
)

// startNiced needs Linux (nice_linux.go): it renices each of the child's
// threads, which it finds in /proc.
func startNiced(*exec.Cmd, int) error {
	return errors.New("--attack-nice is supported on Linux only")
}
