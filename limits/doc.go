// Package limits is the one home of the atproto protocol limits Bulwark
// enforces: the sizes and counts relays refuse to go past, with the numbers
// the specs give. The repository engine checks them before a commit is
// stored, the event log when it decides an event must go out as #sync, and
// the XRPC layer when it refuses a request early; all of them read these
// constants, so a limit is never written down twice.
//
// The package holds constants only. Where a limit is checked, and the error
// that names it, belong to the package that checks it.
package limits
