package metrics

import (
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/ratelimit"
)

// BudgetStats is a snapshot of an in-flight budget, field for field a
// budget.Stats (which converts to it): the metrics package reads budgets
// through a function so that it does not depend on package budget, and
// the packages that record commits and events (which import metrics) stay
// apart from the protection layer.
type BudgetStats struct {
	Capacity, InUse                      int64
	QueueLen, MaxQueue                   int
	Admitted, Waited, Rejected, Canceled uint64
}

// RegisterBudget makes the scrape report the in-flight byte budget whose
// state stats returns (for a *budget.Budget b, a function returning
// BudgetStats(b.Stats())): bytes in use, capacity, queue length, and the
// admitted, queued, refused (503) and canceled counts. A later call
// replaces the budget reported; nil stops reporting.
func RegisterBudget(stats func() BudgetStats) {
	budgetCollector.mu.Lock()
	defer budgetCollector.mu.Unlock()
	budgetCollector.stats = stats
}

// RegisterExportSlots makes the scrape report the budget a server uses as
// a FIFO semaphore of getRepo export slots (one unit per export), read
// through stats as RegisterBudget does, under bulwark_export_slots_*:
// slots in use, queue length, and the admitted, queued, refused (503) and
// canceled counts. nil stops reporting.
func RegisterExportSlots(stats func() BudgetStats) {
	exportSlotsCollector.mu.Lock()
	defer exportSlotsCollector.mu.Unlock()
	exportSlotsCollector.stats = stats
}

// RegisterPasswordSlots makes the scrape report the budget a server uses
// as a FIFO semaphore of password-hash slots (one unit per hash), read
// through stats as RegisterBudget does, under bulwark_password_slots_*:
// hashes running, checks waiting, and the admitted, queued, refused (503
// at a full queue) and canceled (the wait ran out, or the client left)
// counts. nil stops reporting.
func RegisterPasswordSlots(stats func() BudgetStats) {
	passwordSlotsCollector.mu.Lock()
	defer passwordSlotsCollector.mu.Unlock()
	passwordSlotsCollector.stats = stats
}

// RegisterLimiters makes the scrape report ls (typically
// ratelimit.Set.All()): allowed and refused calls by limiter and rule,
// keys tracked, and keys evicted. A later call replaces the set.
func RegisterLimiters(ls ...*ratelimit.Limiter) {
	limiterCollector.mu.Lock()
	defer limiterCollector.mu.Unlock()
	limiterCollector.ls = append([]*ratelimit.Limiter(nil), ls...)
}

// RegisterPool makes the scrape report p's connection pool statistics. A
// later call replaces the pool; nil stops reporting.
func RegisterPool(p *pgxpool.Pool) {
	poolCollector.mu.Lock()
	defer poolCollector.mu.Unlock()
	poolCollector.p = p
}

func desc(subsystem, name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
}

var budgetCollector = &budgetStats{
	capacity: desc("budget", "capacity_bytes", "In-flight byte budget capacity."),
	inUse:    desc("budget", "in_use_bytes", "Bytes reserved by expensive responses in flight."),
	queue:    desc("budget", "queue_length", "Requests waiting for budget."),
	maxQueue: desc("budget", "queue_max", "Bound of the budget wait queue."),
	admitted: desc("budget", "admitted_total", "Reservations granted."),
	waited:   desc("budget", "waited_total", "Requests that queued for budget."),
	rejected: desc("budget", "rejected_total", "Requests refused with 503 because the wait queue was full."),
	canceled: desc("budget", "canceled_total", "Waiters whose client went away before admission."),
}

var exportSlotsCollector = &budgetStats{
	capacity: desc("export_slots", "capacity", "getRepo exports that may run at once."),
	inUse:    desc("export_slots", "in_use", "getRepo exports running."),
	queue:    desc("export_slots", "queue_length", "getRepo exports waiting for a slot."),
	maxQueue: desc("export_slots", "queue_max", "Bound of the export slot wait queue."),
	admitted: desc("export_slots", "admitted_total", "getRepo exports started."),
	waited:   desc("export_slots", "waited_total", "getRepo exports that queued for a slot."),
	rejected: desc("export_slots", "rejected_total", "getRepo exports refused with 503 because the wait queue was full."),
	canceled: desc("export_slots", "canceled_total", "Waiting exports whose client went away."),
}

var passwordSlotsCollector = &budgetStats{
	capacity: desc("password_slots", "capacity", "Password hashes that may run at once."),
	inUse:    desc("password_slots", "in_use", "Password hashes running."),
	queue:    desc("password_slots", "queue_length", "Password checks waiting for a hash slot."),
	maxQueue: desc("password_slots", "queue_max", "Bound of the password-hash wait queue."),
	admitted: desc("password_slots", "admitted_total", "Password hashes started."),
	waited:   desc("password_slots", "waited_total", "Password checks that queued for a hash slot."),
	rejected: desc("password_slots", "rejected_total", "Password checks refused with 503 because the wait queue was full."),
	canceled: desc("password_slots", "canceled_total", "Waiting password checks whose wait ran out (503) or whose client went away."),
}

type budgetStats struct {
	mu                                   sync.Mutex
	stats                                func() BudgetStats
	capacity, inUse, queue, maxQueue     *prometheus.Desc
	admitted, waited, rejected, canceled *prometheus.Desc
}

func (c *budgetStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.capacity, c.inUse, c.queue, c.maxQueue, c.admitted, c.waited, c.rejected, c.canceled} {
		ch <- d
	}
}

func (c *budgetStats) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats := c.stats
	c.mu.Unlock()
	if stats == nil {
		return
	}
	s := stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.capacity, float64(s.Capacity))
	gauge(c.inUse, float64(s.InUse))
	gauge(c.queue, float64(s.QueueLen))
	gauge(c.maxQueue, float64(s.MaxQueue))
	counter(c.admitted, s.Admitted)
	counter(c.waited, s.Waited)
	counter(c.rejected, s.Rejected)
	counter(c.canceled, s.Canceled)
}

var limiterCollector = &limiterStats{
	allowed: desc("ratelimit", "allowed_total", "Calls allowed, by limiter.", "limiter"),
	refused: desc("ratelimit", "refused_total", "Calls refused with 429, by limiter and the rule that refused.", "limiter", "rule"),
	keys:    desc("ratelimit", "keys", "Keys tracked, by limiter.", "limiter"),
	evicted: desc("ratelimit", "evicted_total", "Keys evicted before their buckets refilled because the table was full.", "limiter"),
}

type limiterStats struct {
	mu                              sync.Mutex
	ls                              []*ratelimit.Limiter
	allowed, refused, keys, evicted *prometheus.Desc
}

func (c *limiterStats) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.allowed
	ch <- c.refused
	ch <- c.keys
	ch <- c.evicted
}

func (c *limiterStats) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ls := c.ls
	c.mu.Unlock()
	for _, l := range ls {
		s := l.Stats()
		ch <- prometheus.MustNewConstMetric(c.allowed, prometheus.CounterValue, float64(s.Allowed), s.Name)
		for _, r := range l.Rules() {
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(s.Refused[r.Name]), s.Name, r.Name)
		}
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(s.Keys), s.Name)
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(s.Evicted), s.Name)
	}
}

var poolCollector = &poolStats{
	acquired:         desc("pg_pool", "acquired_conns", "Connections checked out of the pool."),
	idle:             desc("pg_pool", "idle_conns", "Idle connections in the pool."),
	total:            desc("pg_pool", "total_conns", "Connections in the pool (acquired, idle and being built)."),
	constructing:     desc("pg_pool", "constructing_conns", "Connections being established."),
	max:              desc("pg_pool", "max_conns", "Pool size limit."),
	acquires:         desc("pg_pool", "acquires_total", "Connection acquisitions."),
	acquireSeconds:   desc("pg_pool", "acquire_duration_seconds_total", "Total time spent acquiring connections."),
	emptyAcquires:    desc("pg_pool", "empty_acquires_total", "Acquisitions that had to wait for a connection: the pool was exhausted."),
	emptyWaitSeconds: desc("pg_pool", "empty_acquire_wait_seconds_total", "Total time acquisitions waited for a free connection."),
	canceledAcquires: desc("pg_pool", "canceled_acquires_total", "Acquisitions canceled by their context."),
	newConns:         desc("pg_pool", "new_conns_total", "Connections opened."),
	lifetimeDestroys: desc("pg_pool", "max_lifetime_destroys_total", "Connections closed for reaching their maximum lifetime."),
	idleDestroys:     desc("pg_pool", "max_idle_destroys_total", "Connections closed for being idle too long."),
}

type poolStats struct {
	mu                                           sync.Mutex
	p                                            *pgxpool.Pool
	acquired, idle, total, constructing, max     *prometheus.Desc
	acquires, acquireSeconds, emptyAcquires      *prometheus.Desc
	emptyWaitSeconds, canceledAcquires, newConns *prometheus.Desc
	lifetimeDestroys, idleDestroys               *prometheus.Desc
}

func (c *poolStats) all() []*prometheus.Desc {
	return []*prometheus.Desc{c.acquired, c.idle, c.total, c.constructing, c.max,
		c.acquires, c.acquireSeconds, c.emptyAcquires, c.emptyWaitSeconds, c.canceledAcquires,
		c.newConns, c.lifetimeDestroys, c.idleDestroys}
}

func (c *poolStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.all() {
		ch <- d
	}
}

func (c *poolStats) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	p := c.p
	c.mu.Unlock()
	if p == nil {
		return
	}
	s := p.Stat()
	gauge := func(d *prometheus.Desc, v int32) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.acquired, s.AcquiredConns())
	gauge(c.idle, s.IdleConns())
	gauge(c.total, s.TotalConns())
	gauge(c.constructing, s.ConstructingConns())
	gauge(c.max, s.MaxConns())
	counter(c.acquires, float64(s.AcquireCount()))
	counter(c.acquireSeconds, s.AcquireDuration().Seconds())
	counter(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	counter(c.emptyWaitSeconds, s.EmptyAcquireWaitTime().Seconds())
	counter(c.canceledAcquires, float64(s.CanceledAcquireCount()))
	counter(c.newConns, float64(s.NewConnsCount()))
	counter(c.lifetimeDestroys, float64(s.MaxLifetimeDestroyCount()))
	counter(c.idleDestroys, float64(s.MaxIdleDestroyCount()))
}
