// Package serverid says which server a data directory belongs to, and
// lets a client on the same machine make sure it is talking to that
// server before it sends the admin password.
//
// A starting server takes the data directory's lock (Lock: one server per
// data directory, whatever database it uses), then writes RuntimeFile
// into it: its admin URL, public URL, service DID, a random instance id
// and a random proof key, readable by the data directory's owner only.
// `bulwark admin` reads that file, sends the server a nonce and the URL it
// used, and sends credentials only when the answer is the HMAC of both
// under the proof key (Proof). The server proves only for URLs that are
// its own addresses (Addresses.Own), so a program on another port that
// relays the challenge to the real server gets nothing it can use.
//
// The database records the host name its accounts' DID documents point
// at (RecordedHost, RecordHost): a server started under another name
// against the same accounts is refused at start, and a backup names the
// recorded host rather than whatever the backup command was configured
// with.
package serverid
