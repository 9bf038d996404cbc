//go:build !linux

package db

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not available;
// keepalives still find a dead server.
func setUserTimeout(string, string, syscall.RawConn) error { return nil }
