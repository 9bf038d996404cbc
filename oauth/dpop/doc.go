// Package dpop verifies DPoP proofs (RFC 9449) as the atproto OAuth profile
// requires them: ES256 only, a server nonce in every proof, a bounded
// memory of seen proof ids, and the key thumbprint (RFC 7638 "jkt") that
// tokens are bound to.
//
// Nonces are derived from a secret and the current time window, so every
// node that shares the secret issues and accepts the same nonces without
// talking to the others. The replay memory, by contrast, is per process: a
// proof replayed against another node within its short lifetime is not
// caught there (the nonce and the iat window still bound how long a
// captured proof is any use).
package dpop
