// Package devdns is a small authoritative DNS server for tests and local
// development: it answers TXT and A/AAAA questions from records set at run
// time (anything else is NXDOMAIN), over UDP and TCP on one loopback port.
// Bulwark is pointed at it with --dns-server (outbound lookups: handle
// TXT records, lexicon authorities, names to connect to), so that lexicon
// and handle resolution run against a real DNS protocol offline. A name
// can be held, so that its answers wait until the test releases them (a
// slow or unresponsive DNS server).
package devdns

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"

	"github.com/bulwark-pds/bulwark/outbound"
)

// Server is a running DNS server.
type Server struct {
	// Addr is host:port, the same for UDP and TCP.
	Addr string
	udp  *dns.Server
	tcp  *dns.Server

	mu      sync.Mutex
	txt     map[string][]string
	addrs   map[string][]netip.Addr
	held    map[string]chan struct{}
	queries map[string]int
}

// Start serves on addr ("127.0.0.1:0" picks a port free for both UDP
// and TCP).
func Start(addr string) (*Server, error) {
	pc, ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: pc.LocalAddr().String(), txt: map[string][]string{}, addrs: map[string][]netip.Addr{},
		held: map[string]chan struct{}{}, queries: map[string]int{}}
	h := dns.HandlerFunc(s.serve)
	s.udp = &dns.Server{PacketConn: pc, Handler: h}
	s.tcp = &dns.Server{Listener: ln, Handler: h}
	started := make(chan struct{}, 2)
	s.udp.NotifyStartedFunc = func() { started <- struct{}{} }
	s.tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go func() { _ = s.udp.ActivateAndServe() }()
	go func() { _ = s.tcp.ActivateAndServe() }()
	<-started
	<-started
	return s, nil
}

// listen opens addr over UDP and TCP; with port 0, it tries ports until
// one is free for both.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	for try := 0; ; try++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, err
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if port != "0" || try == 20 {
			return nil, nil, err
		}
	}
}

// Close stops the server and releases every held name.
func (s *Server) Close() {
	s.mu.Lock()
	for name, ch := range s.held {
		close(ch)
		delete(s.held, name)
	}
	s.mu.Unlock()
	_ = s.udp.Shutdown()
	_ = s.tcp.Shutdown()
}

func fqdn(name string) string { return dns.Fqdn(strings.ToLower(name)) }

// SetTXT sets name's TXT records (none: the name no longer has any).
func (s *Server) SetTXT(name string, values ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.txt[fqdn(name)] = values
}

// SetAddr sets name's A and AAAA records.
func (s *Server) SetAddr(name string, addrs ...netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs[fqdn(name)] = addrs
}

// Hold makes questions about name wait until release is called (or the
// server closes): a DNS server that does not answer.
func (s *Server) Hold(name string) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.held[fqdn(name)] = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.held[fqdn(name)] == ch {
				delete(s.held, fqdn(name))
				close(ch)
			}
			s.mu.Unlock()
		})
	}
}

// Queries is how many questions about name the server has received.
func (s *Server) Queries(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[fqdn(name)]
}

func (s *Server) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	s.mu.Lock()
	s.queries[name]++
	hold := s.held[name]
	txt, hasTXT := s.txt[name]
	addrs, hasAddr := s.addrs[name]
	s.mu.Unlock()
	if hold != nil {
		<-hold
	}
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 1}
	switch {
	case q.Qtype == dns.TypeTXT && hasTXT:
		for _, v := range txt {
			h := hdr
			h.Rrtype = dns.TypeTXT
			m.Answer = append(m.Answer, &dns.TXT{Hdr: h, Txt: splitTXT(v)})
		}
	case (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) && hasAddr:
		for _, a := range addrs {
			h := hdr
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				h.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: h, A: a.AsSlice()})
			case q.Qtype == dns.TypeAAAA && a.Is6():
				h.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: h, AAAA: a.AsSlice()})
			}
		}
	case !hasTXT && !hasAddr:
		m.Rcode = dns.RcodeNameError
	}
	_ = w.WriteMsg(m)
}

// splitTXT cuts a value into the 255-byte strings a TXT record holds.
func splitTXT(v string) []string {
	var out []string
	for len(v) > 255 {
		out = append(out, v[:255])
		v = v[255:]
	}
	return append(out, v)
}

// Resolver is a resolver that asks only this server.
func (s *Server) Resolver() *net.Resolver { return outbound.DNSResolver(s.Addr) }

// ErrBadRecord is a --txt or --addr argument of internal/cmd/devdns that
// is not name=value.
var ErrBadRecord = errors.New("a record is name=value")
