// Package plc creates and updates did:plc identities for Bulwark's accounts:
// it builds PLC operations (genesis and updates), signs them with the
// server's rotation key, and submits them to the configured PLC directory
// with github.com/did-method-plc/go-didplc.
//
// Package plctest is a small PLC directory that really verifies the signed
// operations, for tests and for local development (`bulwark dev-plc`).
package plc
