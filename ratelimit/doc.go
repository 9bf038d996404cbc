// Package ratelimit is keyed token-bucket rate limiting with bounded
// memory, shaped like the reference PDS's limits: N points per window
// (3000 per 5 minutes per IP, 30 per 5 minutes and 300 per day for
// createSession by identifier and IP, 5000 write points per hour per DID),
// several windows per limiter (all must allow), and a cost per call.
//
// Each rule is a token bucket holding Limit points that refills at
// Limit/Window: a client may spend a whole window's allowance at once and
// then proceeds at the sustained rate. A refused call consumes nothing, so
// a client that keeps hammering is not pushed further back than the rate
// says, and a call refused by one window does not spend the others.
//
// Memory is bounded: a key whose buckets have refilled completely carries
// no information and is forgotten, and the table never holds more than
// MaxKeys keys; past that, the least recently seen key is evicted. A flood
// from a million addresses therefore costs MaxKeys entries, not a million.
// Eviction forgets that key's spending, which only matters when more
// distinct keys are active at once than the table holds.
//
// State is in memory, per process: behind a load balancer with several
// nodes, each node enforces the limits on the requests it sees, so a client
// spread across k nodes may get up to k times the limit.
package ratelimit
