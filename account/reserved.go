package account

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Reserved signing keys (com.atproto.server.reserveSigningKey): a key
// promised to a DID before its account exists here, so that a DID document
// can name it ahead of createAccount. The reference PDS keeps each such
// key in a file; Bulwark derives it from a server secret and the DID, so
// reserving keeps nothing (an anonymous caller leaves no state), asking
// again for the same DID gives the same key, and createAccount for that
// DID (an account moving here) signs its repository with it.

// reserveInfo separates this use of the server secret from the others.
const reserveInfo = "bulwark reserved signing key v1"

// ErrInvalidDID means a DID given to reserveSigningKey is malformed.
var ErrInvalidDID = errors.New("invalid DID")

// reserved returns the signing key reserved for did: HMAC-SHA256 of the
// DID under the reserve secret, the first output that is a valid K-256
// scalar (all but a 2^-128 fraction are).
func (k *KeyStore) reserved(did syntax.DID) (*atcrypto.PrivateKeyK256, error) {
	for i := uint32(0); ; i++ {
		mac := hmac.New(sha256.New, k.reserve)
		mac.Write([]byte(did))
		var ctr [4]byte
		binary.BigEndian.PutUint32(ctr[:], i)
		mac.Write(ctr[:])
		key, err := atcrypto.ParsePrivateBytesK256(mac.Sum(nil))
		if err == nil {
			return key, nil
		}
		if i >= 16 {
			return nil, err
		}
	}
}

// ReserveSigningKey is com.atproto.server.reserveSigningKey: the public
// half (a did:key) of the signing key reserved for did. Without a DID the
// key is a fresh one and nothing keeps it, as nothing could use it: a
// reservation is used only by createAccount for the DID it names (the
// reference PDS uses one without a DID only on an entryway, with a PLC
// operation in createAccount, which Bulwark does not take).
func (s *Service) ReserveSigningKey(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		key, err := atcrypto.GeneratePrivateKeyK256()
		if err != nil {
			return "", err
		}
		return didKeyOf(key)
	}
	did, err := syntax.ParseDID(raw)
	if err != nil {
		return "", ruleErr(ErrInvalidDID, "did %.120q is not a DID", raw)
	}
	key, err := s.keys.reserved(did)
	if err != nil {
		return "", err
	}
	return didKeyOf(key)
}

func didKeyOf(key *atcrypto.PrivateKeyK256) (string, error) {
	pub, err := key.PublicKey()
	if err != nil {
		return "", err
	}
	return pub.DIDKey(), nil
}
