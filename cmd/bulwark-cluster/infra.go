package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/internal/pgbouncer"
)

// proc is one process the test started, its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs name (argv) in the background, output to <work>/<name>.log.
// When asUser is set (and we are root) it runs as that user.
func (c *cluster) start(name, asUser string, env []string, argv ...string) (*proc, error) {
	logPath := filepath.Join(c.work, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if asUser != "" && os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", asUser, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Its own process group: signals reach it (and runuser's child) only.
	// SIGTERM when this process dies without stopping it (a crash; runuser
	// passes it on), so that no node, Postgres or balancer outlives a run
	// and holds its ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop ends the process: sig, then SIGKILL after grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if !p.running() {
		return
	}
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.signal(syscall.SIGKILL)
		<-p.done
	}
}

// tail is the end of the process's log, for errors.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// waitFor polls cond every 100 ms until it holds, the process dies or
// limit passes. The processes are separate: there is no event to wait on.
func waitFor(p *proc, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if p != nil && !p.running() {
			return fmt.Errorf("%s exited before %s:\n%s", p.name, what, p.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s after %s", what, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func listening(port int) func() bool {
	return func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
}

func healthy(url string) func() bool {
	return func() bool {
		resp, err := http.Get(url + "/xrpc/_health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// pgUser is who Postgres and PgBouncer run as under root (both refuse
// root).
const pgUser = "postgres"

// pgDir makes a directory the Postgres user owns.
func pgDir(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(pgUser)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// postgres is one server of the primary/standby pair.
type postgres struct {
	name string
	dir  string
	port int
	p    *proc
}

func (pg *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", pg.port, db)
}

// startPostgres runs the server on dir: a primary requiring one
// synchronous standby (named standby1), or a standby.
func (c *cluster) startPostgres(pg *postgres, primary bool) error {
	args := []string{filepath.Join(c.pgBin, "postgres"), "-D", pg.dir,
		"-c", "port=" + strconv.Itoa(pg.port), "-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + pg.dir, "-c", "wal_level=replica", "-c", "max_wal_senders=8",
		"-c", "hot_standby=on", "-c", "max_connections=200", "-c", "shared_buffers=64MB",
		// The throughput runs count the commit functions' calls.
		"-c", "track_functions=pl",
	}
	if c.o.profileDir != "" {
		// Postgres's time per statement, inside the functions too.
		args = append(args, "-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=all")
	}
	if primary {
		args = append(args, "-c", "synchronous_standby_names=standby1", "-c", "synchronous_commit=on")
	}
	p, err := c.start(pg.name, pgUser, nil, args...)
	if err != nil {
		return err
	}
	pg.p = p
	return waitFor(p, time.Minute, pg.name+" accepting connections", func() bool {
		conn, err := pgx.Connect(context.Background(), pg.url("postgres"))
		if err != nil {
			return false
		}
		conn.Close(context.Background())
		return true
	})
}

// setupPostgres makes the primary and its synchronous standby, and the
// database the nodes share.
func (c *cluster) setupPostgres(ctx context.Context) error {
	c.primary = &postgres{name: "pg-primary", dir: filepath.Join(c.work, "pg-primary"), port: c.port(portPrimary)}
	c.standby = &postgres{name: "pg-standby", dir: filepath.Join(c.work, "pg-standby"), port: c.port(portStandby)}
	for _, pg := range []*postgres{c.primary, c.standby} {
		if err := pgDir(pg.dir); err != nil {
			return err
		}
	}
	initdb := exec.Command(filepath.Join(c.pgBin, "initdb"), "-D", c.primary.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
	if os.Geteuid() == 0 {
		initdb = exec.Command("runuser", append([]string{"-u", pgUser, "--"}, initdb.Args...)...)
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	hba := "local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(c.primary.dir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return err
	}
	if err := c.chownPG(filepath.Join(c.primary.dir, "pg_hba.conf")); err != nil {
		return err
	}
	if err := c.startPostgres(c.primary, true); err != nil {
		return err
	}
	base := exec.Command(filepath.Join(c.pgBin, "pg_basebackup"), "-D", c.standby.dir, "-R", "-X", "stream",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby1", c.primary.port))
	if os.Geteuid() == 0 {
		base = exec.Command("runuser", append([]string{"-u", pgUser, "--"}, base.Args...)...)
	}
	if out, err := base.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup: %w: %s", err, out)
	}
	// The name the primary's synchronous_standby_names waits for.
	auto, err := os.OpenFile(filepath.Join(c.standby.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(auto, "primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby1'\n", c.primary.port)
	if cerr := auto.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := c.startPostgres(c.standby, false); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.primary.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// Synchronous: the CREATE waits for the standby, so it is streaming.
	if _, err := conn.Exec(ctx, "CREATE DATABASE bulwark"); err != nil {
		return err
	}
	var state, sync string
	err = conn.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&state, &sync)
	if err != nil || sync != "sync" {
		return fmt.Errorf("the standby is not a synchronous one (%s/%s): %v", state, sync, err)
	}
	return nil
}

func (c *cluster) chownPG(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(pgUser)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// failover stops the primary (a fast shutdown: what an HA tool does to a
// primary it fences, and what a lost host looks like to the clients) and
// promotes the standby, as Patroni or CloudNativePG would; the new
// primary, alone now, stops waiting for a synchronous standby. It
// returns when the primary stopped and when the standby took writes.
func (c *cluster) failover(ctx context.Context) (stopped, promoted time.Time, err error) {
	c.primary.p.stop(syscall.SIGINT, time.Minute)
	stopped = time.Now()
	conn, err := pgx.Connect(ctx, c.standby.url("postgres"))
	if err != nil {
		return stopped, promoted, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_promote(true, 60)"); err != nil {
		return stopped, promoted, fmt.Errorf("promote: %w", err)
	}
	promoted = time.Now()
	return stopped, promoted, nil
}

// weed runs SeaweedFS with its S3 gateway and makes the nodes' bucket.
func (c *cluster) startWeed(ctx context.Context) error {
	dir := filepath.Join(c.work, "weed")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	s3cfg := fmt.Sprintf(`{"identities":[{"name":"bulwark","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","Write","List","Tagging"]}]}`, s3AccessKey, s3SecretKey)
	cfgPath := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(cfgPath, []byte(s3cfg), 0o600); err != nil {
		return err
	}
	p, err := c.start("weed", "", nil, c.weedBin, "server", "-dir="+dir, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+strconv.Itoa(c.port(portWeedMaster)), "-master.port.grpc="+strconv.Itoa(c.port(portWeedMaster)+10),
		"-volume.port="+strconv.Itoa(c.port(portWeedVolume)), "-volume.port.grpc="+strconv.Itoa(c.port(portWeedVolume)+10),
		"-filer", "-filer.port="+strconv.Itoa(c.port(portWeedFiler)), "-filer.port.grpc="+strconv.Itoa(c.port(portWeedFiler)+10),
		"-s3", "-s3.port="+strconv.Itoa(c.port(portS3)), "-s3.port.grpc="+strconv.Itoa(c.port(portS3)+10), "-s3.config="+cfgPath,
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-volume.max=8", "-master.volumeSizeLimitMB=64")
	if err != nil {
		return err
	}
	c.weed = p
	if err := waitFor(p, 2*time.Minute, "the S3 gateway", listening(c.port(portS3))); err != nil {
		return err
	}
	return waitFor(p, 2*time.Minute, "the bucket", func() bool { return c.createBucket(ctx) == nil })
}

// haproxy balances the nodes round robin, checking each one's health
// every half second (two failures take it out). Two more frontends serve
// the throughput runs: one keeps each account on one node (a hash of the
// Authorization header, as docs/SCALING.md configures it), the other
// sends everything to the first node.
func (c *cluster) startHAProxy(nodes []*node) error {
	var servers strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&servers, "  server %s 127.0.0.1:%d check\n", n.name, n.port)
	}
	cfg := fmt.Sprintf(`global
  maxconn 4096
defaults
  mode http
  option forwardfor
  option redispatch
  retries 2
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  timeout tunnel 1h
frontend pds
  bind 127.0.0.1:%d
  default_backend nodes
frontend pds-hash
  bind 127.0.0.1:%d
  default_backend nodes-hash
frontend pds-one
  bind 127.0.0.1:%d
  default_backend nodes-one
backend nodes
  balance roundrobin
  option httpchk GET /xrpc/_health
  http-check expect status 200
  default-server inter 500ms fall 2 rise 1
%sbackend nodes-hash
  balance hdr(Authorization)
  hash-type consistent
  option httpchk GET /xrpc/_health
  http-check expect status 200
  default-server inter 500ms fall 2 rise 1
%sbackend nodes-one
  server %s 127.0.0.1:%d
`, c.port(portHAProxy), c.port(portHAProxyHash), c.port(portHAProxyOne), servers.String(), servers.String(), nodes[0].name, nodes[0].port)
	path := filepath.Join(c.work, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	p, err := c.start("haproxy", "", nil, c.haproxyBin, "-db", "-f", path)
	if err != nil {
		return err
	}
	c.haproxy = p
	return waitFor(p, time.Minute, "HAProxy", healthy(c.lbURL()))
}

// startPgBouncer runs PgBouncer in transaction mode in front of pg.
func (c *cluster) startPgBouncer(pg *postgres) (int, error) {
	dir := filepath.Join(c.work, "pgbouncer")
	if err := pgDir(dir); err != nil {
		return 0, err
	}
	port := c.port(portPgBouncer)
	ini, err := pgbouncer.Config{Server: fmt.Sprintf("host=127.0.0.1 port=%d", pg.port), Port: port, PoolSize: 20, MaxClient: 500}.Write(dir)
	if err != nil {
		return 0, err
	}
	p, err := c.start("pgbouncer", pgUser, nil, c.pgbouncerBin, ini)
	if err != nil {
		return 0, err
	}
	return port, waitFor(p, time.Minute, "PgBouncer", listening(port))
}

// findBinary is path if set, else the first of names found in PATH or
// the given directories.
func findBinary(path string, names []string, dirs ...string) (string, error) {
	if path != "" {
		return path, nil
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, n)); err == nil {
				return filepath.Join(d, n), nil
			}
		}
	}
	return "", errors.New("none of " + strings.Join(names, ", ") + " found")
}
