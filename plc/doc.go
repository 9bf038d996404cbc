// Package plc creates and updates did:plc identities for Bulwark's accounts:
// it builds PLC operations (genesis and updates), signs them with the
// server's rotation key, and submits them to the configured PLC directory
// with github.com/did-method-plc/go-didplc.
//
// It refuses to publish a plain-http PDS endpoint in a public directory
// (CheckEndpoint, ErrInsecureEndpoint) before signing or sending anything.
//
// Package plctest is a small PLC directory that really verifies the signed
// operations, for tests and for local development: the development PLC
// `bulwark serve` runs for a local host name (stored in Postgres), and
// `bulwark dev-plc` (stored in a file).
package plc
