// End-to-end check of service proxying with the reference client library,
// @atproto/api: the app view, feed and chat reads a Bluesky client makes
// through its PDS, answered by fake services (internal/cmd/fakeservices)
// that verify every service-auth token against the PLC directory and
// record its iss, aud and lxm. Run by scripts/proxy-api.sh.
import assert from 'node:assert/strict'
import { AtpAgent } from '@atproto/api'

const service = process.argv[2]
const { APPVIEW_URL, APPVIEW_DID, CHAT_DID, FEEDGEN_DID, FEED_URI } = process.env
for (const [k, v] of Object.entries({ APPVIEW_URL, APPVIEW_DID, CHAT_DID, FEEDGEN_DID, FEED_URI })) {
  assert.ok(v, k + ' is not set')
}

const handle = 'proxy' + (Date.now() % 100000) + '.test'
const password = 'proxy-e2e-password'
const agent = new AtpAgent({ service })
await agent.createAccount({ handle, email: handle + '@example.com', password })
const did = agent.session.did
console.log('createAccount', did, handle)

const tl = await agent.getTimeline({ limit: 30 })
assert.equal(tl.data.feed.length, 2)
console.log('getTimeline', tl.data.feed.map((f) => f.post.record.text))

const prof = await agent.getProfile({ actor: did })
assert.equal(prof.data.did, did)
console.log('getProfile', prof.data.displayName)

const feed = await agent.app.bsky.feed.getFeed({ feed: FEED_URI })
assert.equal(feed.data.feed.length, 1)
console.log('getFeed', feed.data.feed[0].post.uri)

const notifs = await agent.listNotifications()
assert.equal(notifs.data.notifications.length, 1)
console.log('listNotifications', notifs.data.notifications[0].reason)

const chat = agent.withProxy('bsky_chat', CHAT_DID)
const convos = await chat.chat.bsky.convo.listConvos()
assert.deepEqual(convos.data.convos, [])
console.log('chat.bsky.convo.listConvos', convos.data.convos.length)

// The configured app view named by the header, as the Bluesky app sends it.
const viaHeader = agent.withProxy('bsky_appview', APPVIEW_DID)
await viaHeader.app.bsky.actor.getProfile({ actor: did })
console.log('getProfile with atproto-proxy ok')

// Preferences: served by Bulwark where it stores them, else proxied to the
// app view; either way they must work.
const prefs = [{ $type: 'app.bsky.actor.defs#adultContentPref', enabled: false }]
await agent.app.bsky.actor.putPreferences({ preferences: prefs })
const got = await agent.app.bsky.actor.getPreferences()
assert.ok(Array.isArray(got.data.preferences))
assert.ok(got.data.preferences.some((p) => p.$type === 'app.bsky.actor.defs#adultContentPref' && p.enabled === false))
console.log('putPreferences/getPreferences', got.data.preferences.length)

// An ordinary app password may not chat; nothing reaches the chat service.
const app = await agent.com.atproto.server.createAppPassword({ name: 'no-chat' })
const appAgent = new AtpAgent({ service })
await appAgent.login({ identifier: handle, password: app.data.password })
await assert.rejects(appAgent.withProxy('bsky_chat', CHAT_DID).chat.bsky.convo.listConvos(), (err) => {
  assert.equal(err.status, 400)
  assert.equal(err.error, 'InvalidToken')
  return true
})
console.log('chat from an app password refused')

// Read-after-write, as a new account meets it: the app view has seen only
// the genesis commit, and answers the account's own feed empty and its new
// post NotFound. The posts Bulwark splices in, with their embeds, must be
// what the lexicons say (the client library checks every answer).
const genesis = (await agent.com.atproto.sync.getLatestCommit({ did })).data.rev
assert.equal((await fetch(`${APPVIEW_URL}/_repoRev?did=${did}&rev=${genesis}`, { method: 'POST' })).status, 204)
const png = Uint8Array.from(atob('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='), (c) => c.charCodeAt(0))
const image = (await agent.uploadBlob(png, { encoding: 'image/png' })).data.blob
// The start of an MP4 file (an ftyp box), which is what the server sniffs.
const mp4 = new Uint8Array([0, 0, 0, 0x18, ...new TextEncoder().encode('ftypmp42'), 0, 0, 0, 0, ...new TextEncoder().encode('mp42isom')])
const clip = (await agent.uploadBlob(mp4, { encoding: 'video/mp4' })).data.blob
const quoted = { uri: 'at://did:plc:fakeauthor2345fakeauthor/app.bsky.feed.post/quoted', cid: 'bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm' }
const embeds = [
  { $type: 'app.bsky.embed.recordWithMedia', record: { $type: 'app.bsky.embed.record', record: quoted },
    media: { $type: 'app.bsky.embed.images', images: [{ image, alt: 'a pixel', aspectRatio: { width: 1, height: 1 } }] } },
  { $type: 'app.bsky.embed.video', video: clip, alt: 'a clip' },
  { $type: 'app.bsky.embed.external', external: { uri: 'https://example.com/', title: 'Example', description: 'a link', thumb: image } },
]
const posts = []
for (const embed of embeds) {
  posts.push((await agent.post({ text: 'with ' + embed.$type, embed })).uri)
}
const own = await agent.getAuthorFeed({ actor: did })
assert.deepEqual(own.data.feed.map((f) => f.post.uri), [...posts].reverse())
assert.ok(own.headers['atproto-upstream-lag'], 'spliced')
assert.equal(own.data.feed[2].post.embed.$type, 'app.bsky.embed.recordWithMedia#view')
assert.equal(own.data.feed[2].post.embed.record.record.$type, 'app.bsky.embed.record#viewRecord')
assert.equal(own.data.feed[1].post.embed.$type, 'app.bsky.embed.video#view')
assert.equal(own.data.feed[0].post.embed.$type, 'app.bsky.embed.external#view')
console.log('getAuthorFeed of a new account', own.data.feed.map((f) => f.post.embed.$type))
const thread = await agent.getPostThread({ uri: posts[0] })
assert.equal(thread.data.thread.post.uri, posts[0])
console.log('getPostThread of a new post the app view has not seen', thread.data.thread.$type)

// What the services got: one verified token per call, iss = the account,
// aud = the service (the feed generator for getFeed), lxm = the method.
const recorded = await (await fetch(APPVIEW_URL + '/_recorded')).json()
const expect = (svc, method, aud, lxm, count = 1) => {
  const calls = recorded.filter((c) => c.service === svc && c.method === method)
  assert.equal(calls.length, count, `${svc} ${method}: ${JSON.stringify(calls)}`)
  for (const c of calls) {
    assert.deepEqual(c, { service: svc, method, iss: did, aud, lxm, verified: true })
  }
  console.log('recorded', svc, method, 'iss', did, 'aud', aud, 'lxm', lxm, 'x' + count)
}
expect('appview', 'app.bsky.feed.getTimeline', APPVIEW_DID, 'app.bsky.feed.getTimeline')
expect('appview', 'app.bsky.actor.getProfile', APPVIEW_DID, 'app.bsky.actor.getProfile', 2)
expect('appview', 'app.bsky.feed.getFeed', FEEDGEN_DID, 'app.bsky.feed.getFeedSkeleton')
expect('feedgen', 'app.bsky.feed.getFeedSkeleton', FEEDGEN_DID, 'app.bsky.feed.getFeedSkeleton')
expect('appview', 'app.bsky.notification.listNotifications', APPVIEW_DID, 'app.bsky.notification.listNotifications')
expect('chat', 'chat.bsky.convo.listConvos', CHAT_DID, 'chat.bsky.convo.listConvos')
for (const m of ['app.bsky.actor.putPreferences', 'app.bsky.actor.getPreferences']) {
  if (recorded.some((c) => c.method === m)) {
    expect('appview', m, APPVIEW_DID, m)
  } else {
    console.log(m, 'served by Bulwark')
  }
}
assert.ok(recorded.every((c) => c.verified || !c.iss), 'no token was refused: ' + JSON.stringify(recorded))
console.log('proxy e2e ok')
