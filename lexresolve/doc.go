// Package lexresolve fetches lexicon schemas as the lexicon spec publishes
// them, and believes only what their publisher signed: the NSID's
// authority names a DID in a DNS TXT record (_lexicon.<reversed
// authority>, outbound.Client.ResolveNSID), the DID document names the
// account's PDS and signing key, and the PDS answers
// com.atproto.sync.getRecord for com.atproto.lexicon.schema/<nsid> with a
// CAR proof: the signed commit, the MST nodes down to the record, and the
// record. Every block's CID is recomputed from its bytes, the commit must
// be the DID's and signed with its key, and the record must sit at its
// path in the tree the commit signed; then it must be a lexicon document
// whose id is the NSID.
//
// Every fetch goes through the SSRF-guarded outbound client (and its DNS
// resolver, which is configuration), bounded in size; callers bound the
// time with the context and cache the results (package oauth keeps the
// permission sets it resolves).
package lexresolve
