// End to end with the reference OAuth client (@atproto/oauth-client-node)
// and a real browser (Debian's Chromium, driven by playwright-core): an
// app signs a person in to Bulwark (PAR, the sign-in and consent pages,
// the callback, the token), posts with its DPoP-bound token, is refused
// what its scope does not grant, refreshes, and signs out; its copy of the
// token is then refused. A second sign-in is revoked from the account's
// connected-apps page. Then a second app asks for a permission set
// (include: scope) that an account on the same server publishes, with the
// _lexicon TXT record served by a DNS server on this machine: the consent
// page shows what the set grants, the tokens get exactly that, and the
// app, being public, is refused silent sign-in (prompt=none). Every page
// passes the accessibility checks in pages.mjs, and the browser talks to
// no host but Bulwark and the apps' callback. Last, an account that turned
// on email sign-in codes signs in: the page asks for the mailed code
// after the password, refuses a wrong one, and signs in with the right
// one (read as the operator of a server without SMTP reads it, with the
// admin method behind `bulwark admin account tokens`). Run by
// scripts/oauth-browser.sh.
//
// Usage: DNS_CONTROL=<devdns control URL> ADMIN_PASSWORD=<the server's>
//   node e2e.mjs <bulwark url, e.g. http://localhost:2583>
import { mkdtempSync, rmSync } from 'node:fs'
import http from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { NodeOAuthClient, buildAtprotoLoopbackClientMetadata } from '@atproto/oauth-client-node'
import { chromium } from 'playwright-core'
import { rawGetSession } from './dpop.mjs'
import { checkPage } from './pages.mjs'

const pds = process.argv[2]
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium'
// Posts only: the app may create app.bsky.feed.post records and nothing else.
const SCOPE = 'atproto repo:app.bsky.feed.post?action=create'

let passed = 0
let failed = 0
// expectedRefusals counts the 401 pages a step is about to be shown.
let expectedRefusals = 0
function check (name, ok, detail) {
  if (ok) {
    passed++
    console.log(`ok - ${name}`)
    return
  }
  failed++
  console.log(`not ok - ${name}${detail ? `\n  ${String(detail).replaceAll('\n', '\n  ')}` : ''}`)
  throw new Error(`check failed: ${name}`)
}

// mapStore is the client's state and session store, kept in memory; the
// test reads the session's tokens and DPoP key from it.
function mapStore () {
  const m = new Map()
  return { m, get: async (k) => m.get(k), set: async (k, v) => { m.set(k, v) }, del: async (k) => { m.delete(k) } }
}

// One process, so a promise chain per name is lock enough.
const locks = new Map()
function requestLock (name, fn) {
  const prev = locks.get(name) ?? Promise.resolve()
  const run = prev.then(fn, fn)
  locks.set(name, run.catch(() => {}))
  return run
}

async function createAccount (prefix = 'oauth') {
  const handle = `${prefix}${Date.now() % 1000000}.test`
  const password = 'oauth-e2e-password'
  const res = await fetch(`${pds}/xrpc/com.atproto.server.createAccount`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ handle, email: `${handle}@example.com`, password })
  })
  const body = await res.json()
  check('createAccount', res.status === 200, JSON.stringify(body))
  return { handle, password, did: body.did, accessJwt: body.accessJwt }
}

// callbackServer is the app's redirect URI on a loopback port: it finishes
// each sign-in with client.callback and hands the session to the waiter.
async function callbackServer () {
  const waiters = []
  const srv = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://127.0.0.1')
    if (url.pathname !== '/callback') {
      res.writeHead(404).end()
      return
    }
    const w = waiters.shift()
    try {
      const { session } = await srv.client.callback(url.searchParams)
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' })
      res.end('<!doctype html><html lang="en"><title>Signed in</title><h1>Signed in</h1></html>')
      w?.resolve(session)
    } catch (err) {
      // The app tells the person, as a page (not an error status, which
      // the browser would log).
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' })
      res.end('<!doctype html><html lang="en"><title>Not signed in</title><h1>Not signed in</h1></html>')
      // What the server sent back, for checks on refusals.
      err.callbackError = url.searchParams.get('error')
      w?.reject(err)
    }
  })
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve))
  srv.next = () => new Promise((resolve, reject) => waiters.push({ resolve, reject }))
  srv.origin = `http://127.0.0.1:${srv.address().port}`
  return srv
}

async function xrpcPost (session, nsid, body) {
  const res = await session.fetchHandler(`/xrpc/${nsid}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body)
  })
  return { status: res.status, body: await res.json().catch(() => null), challenge: res.headers.get('www-authenticate') ?? '' }
}

const post = (text) => ({ $type: 'app.bsky.feed.post', text, createdAt: new Date().toISOString() })

async function signInFlow (page, client, cb, user) {
  const authURL = await client.authorize(user.handle, { scope: SCOPE })
  check('PAR accepted; the authorization URL is Bulwark\'s', authURL.origin === new URL(pds).origin, authURL.href)
  await page.goto(authURL.href)
  check('sign-in page shown', await page.locator('h1#page-title').textContent() === 'Sign in')
  await checkPage(page, 'sign-in page', ['identifier', 'password', 'signin-submit', 'cancel'], check)
  await page.fill('#identifier', user.handle)
  await page.fill('#password', user.password)
  // The form posts to the same URL, so wait for what only the next page
  // has.
  await page.click('#signin-submit')
  await page.locator('#consent-form').waitFor()
  return consent(page, cb, true)
}

// consent checks the consent page and allows; the browser then goes to the
// app's callback, which completes the sign-in.
async function consent (page, cb, checkPages) {
  check('consent page shown', await page.locator('h1#page-title').textContent() === 'Allow access?')
  const perms = await page.locator('ul#permissions li').allTextContents()
  check('consent page lists the permissions', perms.length >= 2 && perms.some(p => /post/i.test(p)), perms.join(' | '))
  if (checkPages) await checkPage(page, 'consent page', ['a[href=/oauth/account]', 'approve', 'deny'], check)
  const done = cb.next()
  await page.click('#approve')
  const session = await done
  await page.waitForURL(`${cb.origin}/callback**`)
  return session
}

async function main () {
  const user = await createAccount()
  const cb = await callbackServer()
  const sessions = mapStore()
  const client = new NodeOAuthClient({
    clientMetadata: buildAtprotoLoopbackClientMetadata({ scope: SCOPE, redirect_uris: [`${cb.origin}/callback`] }),
    stateStore: mapStore(),
    sessionStore: sessions,
    requestLock,
    // .test handles resolve at the PDS, DIDs at its development PLC, and
    // a local server's issuer is http://localhost:<port>.
    handleResolver: pds,
    plcDirectoryUrl: pds,
    allowHttp: true
  })
  cb.client = client

  const profile = mkdtempSync(join(tmpdir(), 'bulwark-chromium-'))
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync']
  })
  const requests = []
  const consoleErrors = []
  browser.on('request', (r) => requests.push(r.url()))
  try {
    const page = browser.pages()[0] ?? await browser.newPage()
    page.on('console', (m) => {
      // The browser asks every origin for /favicon.ico; neither has one.
      const where = m.location()?.url ?? ''
      if (m.type() !== 'error' || where.endsWith('/favicon.ico')) return
      // A refusal the test asked for is a page with a 4xx status, which
      // the browser reports as a failed load.
      if (expectedRefusals > 0 && /status of 401/.test(m.text())) {
        expectedRefusals--
        return
      }
      consoleErrors.push(`${page.url()}: ${m.text()} (${where})`)
    })

    const session = await signInFlow(page, client, cb, user)
    check('callback: the session is the account\'s', session.did === user.did, session.did)
    await appCalls(session, user)

    const before = sessions.m.get(user.did).tokenSet.access_token
    await session.getTokenInfo(true)
    const after = sessions.m.get(user.did).tokenSet
    check('refresh: a new access token', after.access_token !== before)
    check('refresh: the scope is kept', after.scope === SCOPE, after.scope)
    check('createRecord after refresh', (await xrpcPost(session, 'com.atproto.repo.createRecord',
      { repo: user.did, collection: 'app.bsky.feed.post', record: post('after refresh') })).status === 200)

    const copy = structuredClone(sessions.m.get(user.did))
    check('the stored token works by hand before revocation', (await rawGetSession(pds, copy)).status === 200)
    await session.signOut()
    const refused = await rawGetSession(pds, copy)
    check('revoked by the app: its token is refused (401 invalid_token)',
      refused.status === 401 && refused.challenge.includes('error="invalid_token"'), JSON.stringify(refused))

    await accountPageRevoke(page, client, cb, user, sessions)
    await permissionSet(page, cb, user)
    await signInWithCode(page, cb)
  } finally {
    await browser.close()
    rmSync(profile, { recursive: true, force: true })
    cb.close()
  }

  const allowed = new Set([new URL(pds).origin, cb.origin])
  const foreign = requests.filter((u) => !allowed.has(new URL(u).origin))
  check(`the browser made ${requests.length} requests, all to Bulwark or the app's callback`, foreign.length === 0, foreign.join('\n'))
  check('no console errors on the pages (CSP violations included)', consoleErrors.length === 0, consoleErrors.join('\n'))
}

// appCalls: what the granted scope allows, and what it does not.
async function appCalls (session, user) {
  const created = await xrpcPost(session, 'com.atproto.repo.createRecord',
    { repo: user.did, collection: 'app.bsky.feed.post', record: post('hello from an OAuth app') })
  check('createRecord with the DPoP-bound token', created.status === 200 && created.body.uri.startsWith(`at://${user.did}/app.bsky.feed.post/`), JSON.stringify(created.body))
  const like = await xrpcPost(session, 'com.atproto.repo.createRecord', {
    repo: user.did,
    collection: 'app.bsky.feed.like',
    record: { $type: 'app.bsky.feed.like', subject: { uri: created.body.uri, cid: created.body.cid }, createdAt: new Date().toISOString() }
  })
  check('a like is outside the scope: 403 InsufficientScope', like.status === 403 && like.body.error === 'InsufficientScope' &&
    like.challenge.includes('insufficient_scope'), JSON.stringify(like))
  const del = await xrpcPost(session, 'com.atproto.repo.deleteRecord',
    { repo: user.did, collection: 'app.bsky.feed.post', rkey: created.body.uri.split('/').pop() })
  check('deleting the post is outside the scope: 403', del.status === 403, JSON.stringify(del))
}

// accountPageRevoke signs in again (the browser remembers the account, so
// only consent is asked), then takes the access back on the connected-apps
// page; the app's token stops working.
async function accountPageRevoke (page, client, cb, user, sessions) {
  await page.goto((await client.authorize(user.handle, { scope: SCOPE })).href)
  const session = await consent(page, cb, false)
  const copy = structuredClone(sessions.m.get(user.did))
  check('second sign-in works', (await rawGetSession(pds, copy)).status === 200)

  await page.goto(`${pds}/oauth/account`)
  check('account page shown', await page.locator('h1#page-title').textContent() === 'Connected apps')
  const client0 = await page.locator('#revoke-0').locator('xpath=..').locator('code.grant-client').textContent()
  check('account page lists the app', client0 === client.clientMetadata.client_id, client0)
  await checkPage(page, 'account page', ['revoke-button-0', 'signout'], check)
  await Promise.all([page.waitForURL(/done=revoked/), page.click('#revoke-button-0')])
  check('account page: access removed', await page.locator('#notice-message').isVisible() && await page.locator('#no-grants').isVisible())
  await checkPage(page, 'account page after revoking', ['signout'], check)
  const refused = await rawGetSession(pds, copy)
  check('revoked on the account page: the app\'s token is refused (401 invalid_token)',
    refused.status === 401 && refused.challenge.includes('error="invalid_token"'), JSON.stringify(refused))
  await session.signOut().catch(() => {})
}

// The permission set another account of the same server publishes, and
// what it grants through include:SET_NSID: records of its namespace only
// (the app.bsky.feed.like permission it also declares is outside it).
const SET_NSID = 'test.bulwark.e2e.authNotes'
const SET_SCOPE = `atproto include:${SET_NSID}`
const SET_GRANTS = 'atproto repo:test.bulwark.e2e.note?action=create&action=update'

async function publishSet () {
  const publisher = await createAccount('lexicons')
  const res = await fetch(`${pds}/xrpc/com.atproto.repo.putRecord`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${publisher.accessJwt}` },
    body: JSON.stringify({
      repo: publisher.did,
      collection: 'com.atproto.lexicon.schema',
      rkey: SET_NSID,
      record: {
        $type: 'com.atproto.lexicon.schema',
        lexicon: 1,
        id: SET_NSID,
        defs: {
          main: {
            type: 'permission-set',
            title: 'Notes',
            detail: 'Write and edit your notes.',
            permissions: [
              { type: 'permission', resource: 'repo', collection: ['test.bulwark.e2e.note'], action: ['create', 'update'] },
              { type: 'permission', resource: 'repo', collection: ['app.bsky.feed.like'] }
            ]
          }
        }
      }
    })
  })
  check('the set\'s lexicon record is published', res.status === 200, await res.text())
  const dns = await fetch(`${process.env.DNS_CONTROL}/txt`, {
    method: 'POST', body: new URLSearchParams({ name: '_lexicon.e2e.bulwark.test', value: `did=${publisher.did}` })
  })
  check('the _lexicon TXT record names the publisher', dns.status === 204, await dns.text())
}

// permissionSet: an app asking for include:SET_NSID sees the set on the
// consent page and gets exactly what it grants; prompt=none is refused
// to it (a public app) with consent_required.
async function permissionSet (page, cb, user) {
  await publishSet()
  const sessions = mapStore()
  const client = new NodeOAuthClient({
    clientMetadata: buildAtprotoLoopbackClientMetadata({ scope: SET_SCOPE, redirect_uris: [`${cb.origin}/callback`] }),
    stateStore: mapStore(),
    sessionStore: sessions,
    requestLock,
    handleResolver: pds,
    plcDirectoryUrl: pds,
    allowHttp: true
  })
  cb.client = client
  await page.goto((await client.authorize(user.handle, { scope: SET_SCOPE })).href)
  await page.locator('#consent-form').waitFor()
  check('permission set: its title on the consent page', await page.locator('#set-title-0').textContent() === '“Notes”')
  const lines = await page.locator('#set-permissions-0 li').allTextContents()
  check('permission set: what it grants, in words', lines.length === 1 &&
    lines[0] === 'Create and change records of kind test.bulwark.e2e.note in your repository.', lines.join(' | '))
  await checkPage(page, 'consent page with a permission set', ['a[href=/oauth/account]', 'approve', 'deny'], check)
  const done = cb.next()
  await page.click('#approve')
  const session = await done
  const tokens = sessions.m.get(user.did).tokenSet
  check('permission set: the token endpoint answers exactly what it grants', tokens.scope === SET_GRANTS, tokens.scope)
  const note = await xrpcPost(session, 'com.atproto.repo.createRecord', {
    repo: user.did, collection: 'test.bulwark.e2e.note', record: { $type: 'test.bulwark.e2e.note', text: 'a note' }
  })
  check('permission set: a note can be written', note.status === 200, JSON.stringify(note.body))
  const like = await xrpcPost(session, 'com.atproto.repo.createRecord', {
    repo: user.did, collection: 'app.bsky.feed.like', record: { $type: 'app.bsky.feed.like', subject: { uri: note.body.uri, cid: note.body.cid }, createdAt: new Date().toISOString() }
  })
  check('permission set: what it declares outside its namespace is not granted (403)', like.status === 403, JSON.stringify(like.body))

  const refused = cb.next().then(() => null, (e) => e)
  await page.goto((await client.authorize(user.handle, { scope: SET_SCOPE, prompt: 'none' })).href)
  const err = await refused
  check('prompt=none: a public app is sent back with consent_required, no page shown',
    err?.callbackError === 'consent_required', String(err))
  await session.signOut()
}

// pendingCode is the account's live code for purpose, as the operator
// reads it.
async function pendingCode (did, purpose) {
  const res = await fetch(`${pds}/xrpc/io.github.bulwark-pds.admin.getPendingEmailTokens?account=${encodeURIComponent(did)}`, {
    headers: { authorization: `Basic ${Buffer.from(`admin:${process.env.ADMIN_PASSWORD}`).toString('base64')}` }
  })
  const body = await res.json()
  const code = body.tokens?.find((t) => t.purpose === purpose)?.code
  check(`the operator reads the ${purpose} code`, res.status === 200 && !!code, JSON.stringify({ status: res.status, error: body.error }))
  return code
}

// signInWithCode: an account with email sign-in codes on signs in to an
// app: password, then the mailed code with the password again.
async function signInWithCode (page, cb) {
  const user = await createAccount('codes')
  const email = `${user.handle}@example.com`
  const call = async (nsid, body) => {
    const res = await fetch(`${pds}/xrpc/${nsid}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${user.accessJwt}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined
    })
    check(nsid, res.status === 200, await res.text())
  }
  await call('com.atproto.server.requestEmailConfirmation')
  await call('com.atproto.server.confirmEmail', { email, token: await pendingCode(user.did, 'confirm_email') })
  await call('com.atproto.server.requestEmailUpdate')
  await call('com.atproto.server.updateEmail', { email, emailAuthFactor: true, token: await pendingCode(user.did, 'update_email') })

  const client = new NodeOAuthClient({
    clientMetadata: buildAtprotoLoopbackClientMetadata({ scope: SCOPE, redirect_uris: [`${cb.origin}/callback`] }),
    stateStore: mapStore(),
    sessionStore: mapStore(),
    requestLock,
    handleResolver: pds,
    plcDirectoryUrl: pds,
    allowHttp: true
  })
  cb.client = client
  await page.goto((await client.authorize(user.handle, { scope: SCOPE })).href)
  await page.fill('#identifier', user.handle)
  await page.fill('#password', user.password)
  await page.click('#signin-submit')
  await page.locator('#code').waitFor()
  check('sign-in code: asked for after the password', await page.locator('#notice-message').isVisible())
  check('sign-in code: the identifier is kept, the password is not', await page.inputValue('#identifier') === user.handle &&
    await page.inputValue('#password') === '')
  await checkPage(page, 'sign-in page asking for the code', ['identifier', 'password', 'code', 'signin-submit', 'cancel'], check)

  await page.fill('#password', user.password)
  await page.fill('#code', 'AAAAA-AAAAA')
  expectedRefusals++
  await page.click('#signin-submit')
  await page.locator('#error-message').waitFor()
  check('sign-in code: a wrong code is refused, and the code is asked for again',
    /code is wrong/.test(await page.locator('#error-message').textContent()) && await page.locator('#code').isVisible())
  await checkPage(page, 'sign-in page after a wrong code', ['identifier', 'password', 'code', 'signin-submit', 'cancel'], check)

  await page.fill('#password', user.password)
  await page.fill('#code', await pendingCode(user.did, 'sign_in'))
  await page.click('#signin-submit')
  await page.locator('#consent-form').waitFor()
  const session = await consent(page, cb, false)
  check('sign-in code: the app\'s session is the account\'s', session.did === user.did, session.did)
  await session.signOut()
}

try {
  await main()
} catch (err) {
  if (!String(err.message).startsWith('check failed')) {
    failed++
    console.log(`not ok - ${err.stack}`)
  }
}
console.log(`oauth-browser: ${passed} passed, ${failed} failed`)
process.exit(failed ? 1 : 0)
