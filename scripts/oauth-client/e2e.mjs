// End to end with the reference OAuth client (@atproto/oauth-client-node)
// and a real browser (Debian's Chromium, driven by playwright-core): an
// app signs a person in to Bulwark (PAR, the sign-in and consent pages,
// the callback, the token), posts with its DPoP-bound token, is refused
// what its scope does not grant, refreshes, and signs out; its copy of the
// token is then refused. A second sign-in is revoked from the account's
// connected-apps page. Every page passes the accessibility checks in
// pages.mjs, and the browser talks to no host but Bulwark and the app's
// callback. Run by scripts/oauth-browser.sh.
//
// Usage: node e2e.mjs <bulwark url, e.g. http://localhost:2583>
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

async function createAccount () {
  const handle = `oauth${Date.now() % 1000000}.test`
  const password = 'oauth-e2e-password'
  const res = await fetch(`${pds}/xrpc/com.atproto.server.createAccount`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ handle, email: `${handle}@example.com`, password })
  })
  const body = await res.json()
  check('createAccount', res.status === 200, JSON.stringify(body))
  return { handle, password, did: body.did }
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
      res.writeHead(400, { 'content-type': 'text/plain' }).end(String(err))
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
      if (m.type() === 'error' && !where.endsWith('/favicon.ico')) consoleErrors.push(`${page.url()}: ${m.text()} (${where})`)
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
