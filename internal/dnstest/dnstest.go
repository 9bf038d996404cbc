// Package dnstest is a DNS server for tests: it answers A and TXT queries
// over UDP on a loopback port from records the test sets (and changes while
// it runs), NXDOMAIN for names it has none for. Go's resolver reaches it
// through Resolver (or any resolver configured with its address), so code
// under test resolves handles with real DNS messages instead of a fake
// resolver.
package dnstest

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server is a running test DNS server.
type Server struct {
	conn net.PacketConn
	mu   sync.Mutex
	txt  map[string][]string
	a    map[string][]netip.Addr
	done chan struct{}
}

// Start runs a server on 127.0.0.1 until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("dnstest: %v", err)
	}
	s := &Server{conn: conn, txt: map[string][]string{}, a: map[string][]netip.Addr{}, done: make(chan struct{})}
	go s.serve()
	t.Cleanup(func() {
		_ = conn.Close()
		<-s.done
	})
	return s
}

// Addr is the server's "host:port".
func (s *Server) Addr() string { return s.conn.LocalAddr().String() }

// SetTXT replaces name's TXT records (none: the name has no TXT).
func (s *Server) SetTXT(name string, values ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.txt[canonical(name)] = values
}

// SetA replaces name's A records.
func (s *Server) SetA(name string, addrs ...netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.a[canonical(name)] = addrs
}

// Resolver is a Go resolver that asks only this server.
func (s *Server) Resolver() *net.Resolver {
	addr := s.Addr()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

func (s *Server) serve() {
	defer close(s.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, ok := s.answer(buf[:n]); ok {
			_, _ = s.conn.WriteTo(out, from)
		}
	}
}

// answer builds the reply to one query message.
func (s *Server) answer(msg []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.ToLower(q.Name.String())
	s.mu.Lock()
	txt, hasTXT := s.txt[name]
	addrs, hasA := s.a[name]
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !hasTXT && !hasA {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
	switch q.Type {
	case dnsmessage.TypeTXT:
		for _, v := range txt {
			if b.TXTResource(rr, dnsmessage.TXTResource{TXT: []string{v}}) != nil {
				return nil, false
			}
		}
	case dnsmessage.TypeA:
		for _, a := range addrs {
			if a.Is4() && b.AResource(rr, dnsmessage.AResource{A: a.As4()}) != nil {
				return nil, false
			}
		}
	}
	out, err := b.Finish()
	return out, err == nil
}
