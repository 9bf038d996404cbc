package db

import (
	"net"
	"time"
)

// TCP settings of connections to Postgres. Go's defaults probe an idle
// connection only every 15 s after 15 s, and a connection with data in
// flight to a host that vanished waits out the kernel's retransmissions
// (about 15 minutes): with these, a dead server (or a network partition)
// fails the connection in about half a minute, and the pool reconnects,
// through a multi-host URL to whichever host is the primary now.
const (
	keepAliveIdle     = 10 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3
	// userTimeout bounds how long sent data may stay unacknowledged.
	userTimeout = 30 * time.Second
)

// dialer is the dialer of connections to Postgres; timeout bounds the
// connect (0: none).
func dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     keepAliveIdle,
			Interval: keepAliveInterval,
			Count:    keepAliveCount,
		},
		Control: setUserTimeout,
	}
}
