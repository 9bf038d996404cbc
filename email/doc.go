// Package email sends Bulwark's mail: the codes that confirm an address,
// change it, reset a password, delete an account or sign a PLC operation,
// and an administrator's messages (com.atproto.admin.sendEmail).
//
// Mail goes through a Postgres outbox. A request writes its mail (and, for
// a code, the code's hash in email_tokens) inside its own transaction with
// Mailer.SendToken or Mailer.Enqueue, so the mail exists exactly when the
// request's change does, and a mail server that is down delays mail
// instead of failing the request. A worker (Mailer.Run, or Start/Stop) on
// any number of nodes claims due rows with FOR UPDATE SKIP LOCKED, sends
// them through github.com/wneessen/go-mail, and marks each sent, or
// schedules a retry with capped exponential backoff, or after MaxAttempts
// marks it failed and keeps it for inspection. The commit's NOTIFY wakes
// the workers at once; a poll finds retries that fall due.
//
// Codes look like the reference PDS's ("7KQ2M-XW3ZD"), live 15 minutes,
// work once, and a new request replaces the previous code. Only a hash is
// stored as the token; the plain code stays in the outbox row of the mail
// that carries it until that mail is sent or the code is used, replaced or
// expires. Without an SMTP server mail is "held" and an operator reads the
// codes with PendingTokens; held mail is sent once a node with SMTP runs
// the worker.
//
// Config.RecipientLimit limits the code mail sent to one address (keyed by
// RecipientKey, so the spellings of one mailbox share it), whichever
// account or flow asks: over it SendToken and Enqueue return a
// *RecipientLimitError and issue or queue nothing. An administrator's
// message is exempt.
//
// Each kind of mail has a subject, a plain-text and an HTML template
// (text/template and html/template), embedded, each overridable by a file
// of the same name in Config.TemplateDir.
package email
