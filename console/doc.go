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
// actor; the only SQL of its own keeps its sessions (sessions.sql).
//
// Security: every request spends a point of the global rate limit of the
// client's address (Config.Limiter); a login form checks the admin
// password (each attempt also spends a point of the consoleLogin limit),
// and a login leads only to a console page. Every
// value the console signs names its purpose inside the MAC (package
// internal/keyring, keys derived from the JWT secret and bound to the
// admin password, so changing either ends every session): the login
// attempt's cookie, the session's cookie, and the CSRF tokens of the login
// form and of a session's forms are four purposes, and nothing an
// anonymous visitor is handed stands for anything after a login. A
// session is also a row in console_sessions, deleted at logout, so a
// copied cookie dies with the logout on every node and across restarts.
// Cookies are HttpOnly, SameSite=Strict, Secure unless the server is a
// plain-http development host, valid for Config.SessionTTL. Every form
// carries its CSRF token; cross-site POSTs are refused. Pages are
// html/template with embedded CSS under a strict Content-Security-Policy
// and work without JavaScript; nothing is loaded from another host.
package console
