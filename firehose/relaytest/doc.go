// Package relaytest checks Bulwark's firehose against indigo's relay
// (cmd/relay/testing) running in process with strict Sync 1.1 validation.
//
// It is a package of its own because indigo's relay stream package and its
// events package register the same Prometheus metrics: a test binary that
// links both panics at init. Nothing here may import
// indigo's events package, directly or through Bulwark code.
package relaytest
