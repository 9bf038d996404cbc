// Package console is Bulwark's operator console: server-rendered pages at
// /admin/ that show what the server and its relays are doing and run the
// repairs an operator would otherwise type as `bulwark admin` commands.
//
// Pages: the overview (head seq, events, commits and refusals per minute
// with 24-hour sparklines, accounts by status, the in-flight budget, each
// relay's state from package relaywatch, stuck firehose consumers first),
// the firehose (recent events with their sizes and the protocol limits
// they break, and per event the repairs behind a confirmation page),
// accounts (search, takedown, deactivation, password reset, invite codes)
// and the audit log.
//
// The console calls the domain packages (eventlog, account, audit,
// relaywatch, firehose) as the admin API does, with "console" as the audit
// actor; it runs no SQL of its own.
//
// Security: a login form checks the admin password (each attempt spends a
// point of the consoleLogin rate limit of the client's address); a session
// is a cookie signed with HMAC-SHA256 under a key derived from the JWT
// secret and the admin password (changing either ends every session),
// HttpOnly, SameSite=Strict, Secure unless the server is a plain-http
// development host, valid for Config.SessionTTL. Every form carries a CSRF
// token bound to the session; cross-site POSTs are refused. Pages are
// html/template with embedded CSS under a strict Content-Security-Policy
// and work without JavaScript; nothing is loaded from another host.
package console
