package account

import "github.com/bulwark-pds/bulwark/replay"

// Service-auth JWTs accepted by this server work once: each accepted
// token's jti is recorded, per purpose and issuer, until it expires
// (package replay).

// ServiceAuthUse is one accepted service-auth JWT, as recorded: its
// Purpose is the method it was accepted for (its lxm).
type ServiceAuthUse = replay.Use

// ErrServiceAuthReplayed means a service-auth JWT was accepted before, for
// the same purpose: a token works once.
var ErrServiceAuthReplayed = replay.ErrReplayed
