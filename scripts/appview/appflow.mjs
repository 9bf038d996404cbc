// The Bluesky app's posting flow on Bulwark, read back through Bulwark's
// service proxy from the reference app view, with @atproto/api (which
// checks every answer against the lexicons). Run by scripts/appview.sh
// after check.mjs.
//
// Usage: node appflow.mjs PDS_URL APPVIEW_URL APPVIEW_DID CONTROL_URL
//
// CONTROL_URL is the launcher's ingestion switch (launcher.mjs). Three
// parts:
//
//  1. Live: the app view ingests as it goes, so right after a write it may
//     or may not have the post. Several rounds of: a post, then at once
//     getPostThread of it and getAuthorFeed of the author; a reply, then
//     getPostThread of the reply and of the post. Each answer must be 200
//     with the post in it, whichever of the app view or Bulwark's
//     read-after-write made it. Then new accounts' first posts, the same.
//  2. Behind: ingestion stopped, so every new post is one the app view has
//     not seen. The video flow (getServiceAuth for uploadBlob, uploadBlob
//     with that token as Bearer, a post embedding the blob), an image
//     post, a quote post, a quote with an image, a reply to someone else;
//     each read back at once with getPostThread, then the author feed
//     (and its media and video filters) and the timeline: all answered by
//     Bulwark's splicing, in the shapes the lexicons allow.
//  3. Caught up: ingestion started again; once the app view has the posts
//     of part 2, its own views of them (read directly) must agree with
//     what Bulwark spliced: the same record, author and embed.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { setTimeout as delay } from 'node:timers/promises'
import { AtpAgent } from '@atproto/api'

const [pds, appview, appviewDid, control] = process.argv.slice(2, 6)
if (!pds || !appview || !appviewDid || !control) {
  console.error('usage: node appflow.mjs PDS_URL APPVIEW_URL APPVIEW_DID CONTROL_URL')
  process.exit(2)
}
const started = Date.now()
const DEADLINE_MS = 60_000
const ROUNDS = Number(process.env.APPFLOW_ROUNDS || 6)
const NEW_ACCOUNTS = 3
const LAG = 'atproto-upstream-lag'

async function eventually(what, fn) {
  const deadline = Date.now() + DEADLINE_MS
  for (;;) {
    try {
      return await fn()
    } catch (err) {
      if (Date.now() > deadline) {
        throw new Error(`${what}: not within ${DEADLINE_MS} ms: ${err.message}`, { cause: err })
      }
    }
    await delay(200)
  }
}

async function ingest(action) {
  const res = await fetch(`${control}/ingest/${action}`, { method: 'POST', signal: AbortSignal.timeout(DEADLINE_MS) })
  assert.equal(res.status, 200, `ingest ${action}`)
  return res.json()
}

async function account(name, displayName) {
  const handle = `${name}${String(Date.now() % 1_000_000)}.test`
  const agent = new AtpAgent({ service: pds })
  await agent.createAccount({ handle, email: `${handle}@example.com`, password: `appflow-${name}` })
  if (displayName) {
    await agent.com.atproto.repo.putRecord({
      repo: agent.session.did,
      collection: 'app.bsky.actor.profile',
      rkey: 'self',
      record: { $type: 'app.bsky.actor.profile', displayName },
    })
  }
  // As the Bluesky app sends app.bsky.* reads: to the app view named in
  // atproto-proxy, through the PDS.
  return { agent, view: agent.withProxy('bsky_appview', appviewDid), handle, did: agent.session.did, displayName }
}

const now = () => new Date().toISOString()
const ref = (p) => ({ uri: p.uri, cid: p.cid })

// PNG, 1x1; and the start of an MP4 (an ftyp box and a small mdat), which
// is what Bulwark sniffs the type from.
const png = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==',
  'base64',
)
function mp4() {
  const ftyp = Buffer.concat([Buffer.from([0, 0, 0, 24]), Buffer.from('ftypmp42'), Buffer.from([0, 0, 0, 0]), Buffer.from('mp42isom')])
  const payload = randomBytes(64)
  const mdat = Buffer.concat([Buffer.from([0, 0, 0, 8 + payload.length]), Buffer.from('mdat'), payload])
  return Buffer.concat([ftyp, mdat])
}

// thread reads a post's thread through Bulwark as its author, and asserts
// what the Bluesky app needs: 200 and the post as the thread's anchor.
async function thread(who, uri, cid) {
  const res = await who.view.app.bsky.feed.getPostThread({ uri })
  const t = res.data.thread
  assert.equal(t.$type, 'app.bsky.feed.defs#threadViewPost', `thread of ${uri}: ${JSON.stringify(t)}`)
  assert.equal(t.post.uri, uri)
  assert.equal(t.post.cid, cid)
  assert.equal(t.post.author.did, who.did)
  assert.equal(t.post.author.handle, who.handle)
  return { thread: t, spliced: res.headers[LAG] !== undefined }
}

const replyURIs = (t) => (t.replies ?? []).map((r) => r.post?.uri)

const carol = await account('carol', 'Carol Appflow')
const dave = await account('dave', 'Dave Appflow')
const davePost = await dave.agent.post({ text: 'dave says hello', createdAt: now() })
const direct = new AtpAgent({ service: appview })
await eventually('app view has dave\'s post', async () => {
  const { data } = await direct.app.bsky.feed.getPosts({ uris: [davePost.uri] })
  assert.equal(data.posts.length, 1)
})
console.log('accounts', carol.did, dave.did, `dave's post indexed after ${Date.now() - started} ms`)

// 1. Live.
const count = { appview: 0, spliced: 0 }
const tally = (r) => count[r.spliced ? 'spliced' : 'appview']++
let older
for (let i = 0; i < ROUNDS; i++) {
  const post = await carol.agent.post({ text: `live post ${i}`, createdAt: now() })
  tally(await thread(carol, post.uri, post.cid))
  const feed = await carol.view.app.bsky.feed.getAuthorFeed({ actor: carol.did })
  assert.ok(feed.data.feed.some((it) => it.post.uri === post.uri), `author feed has ${post.uri}`)

  const reply = await carol.agent.post({ text: `live reply ${i}`, reply: { root: ref(post), parent: ref(post) }, createdAt: now() })
  const r = await thread(carol, reply.uri, reply.cid)
  tally(r)
  const up = await thread(carol, post.uri, post.cid)
  assert.ok(replyURIs(up.thread).includes(reply.uri), `thread of ${post.uri} has its reply: ${replyURIs(up.thread)}`)
  tally(up)

  const toDave = await carol.agent.post({ text: `live reply to dave ${i}`, reply: { root: ref(davePost), parent: ref(davePost) }, createdAt: now() })
  const d = await thread(carol, toDave.uri, toDave.cid)
  assert.equal(d.thread.parent?.post?.uri, davePost.uri, 'a reply\'s thread shows its parent')
  tally(d)
  older = post
}
// A new account's first post: the app view may not have seen the account
// at all yet (then it names no revision of it). Its author feed is left
// out: until the app view has the account, it answers "Profile not found"
// for it, as for any actor it does not know.
for (let i = 0; i < NEW_ACCOUNTS; i++) {
  const fresh = await account(`new${i}-`)
  const post = await fresh.agent.post({ text: 'my first post', createdAt: now() })
  tally(await thread(fresh, post.uri, post.cid))
}
console.log(`live: ${ROUNDS} rounds of post, reply, reply to another, each author feed with the post; ` +
  `${NEW_ACCOUNTS} new accounts' first posts: every getPostThread 200 with the post ` +
  `(${count.appview} answered by the app view, ${count.spliced} by Bulwark)`)

// 2. Behind.
await eventually('app view has carol\'s last live post', async () => {
  const { data } = await direct.app.bsky.feed.getPosts({ uris: [older.uri] })
  assert.equal(data.posts.length, 1)
})
await ingest('stop')
const probe = await carol.agent.post({ text: 'after ingestion stopped', createdAt: now() })
await assert.rejects(direct.app.bsky.feed.getPostThread({ uri: probe.uri }), (err) => err.error === 'NotFound',
  'the app view has not seen a post made after ingestion stopped')

// The video flow: the app asks the PDS for a token for its own uploadBlob
// and hands it to the video service, which uploads with it.
const server = await carol.agent.com.atproto.server.describeServer()
const { data: sa } = await carol.agent.com.atproto.server.getServiceAuth({ aud: server.data.did, lxm: 'com.atproto.repo.uploadBlob' })
const videoService = new AtpAgent({ service: pds })
const videoBytes = mp4()
const upload = (bytes, token) =>
  videoService.com.atproto.repo.uploadBlob(bytes, { encoding: 'video/mp4', headers: { authorization: `Bearer ${token}` } })
const { data: vb } = await upload(videoBytes, sa.token)
assert.equal(vb.blob.mimeType, 'video/mp4')
assert.equal(vb.blob.size, videoBytes.length)
await assert.rejects(upload(mp4(), sa.token), (err) => err.status === 401, 'a service-auth token is used once')
const video = { $type: 'app.bsky.embed.video', video: vb.blob, alt: 'a short clip', aspectRatio: { width: 16, height: 9 } }
console.log(`video: getServiceAuth(aud ${server.data.did}, lxm uploadBlob), uploadBlob with it: 200, blob ${vb.blob.ref}; the same token again: 401`)

const { data: ib } = await carol.agent.uploadBlob(png, { encoding: 'image/png' })
const images = { $type: 'app.bsky.embed.images', images: [{ image: ib.blob, alt: 'one pixel', aspectRatio: { width: 1, height: 1 } }] }
const made = {}
const kinds = {
  video: { text: 'a video', embed: video },
  image: { text: 'a picture', embed: images },
  quote: { text: 'quoting dave', embed: { $type: 'app.bsky.embed.record', record: ref(davePost) } },
  quoteWithImage: { text: 'quoting dave, with a picture', embed: { $type: 'app.bsky.embed.recordWithMedia', record: { $type: 'app.bsky.embed.record', record: ref(davePost) }, media: images } },
  replyToDave: { text: 'answering dave', reply: { root: ref(davePost), parent: ref(davePost) } },
  replyToOlder: { text: 'answering my older post', reply: { root: ref(older), parent: ref(older) } },
}
const embedType = {
  video: 'app.bsky.embed.video#view',
  image: 'app.bsky.embed.images#view',
  quote: 'app.bsky.embed.record#view',
  quoteWithImage: 'app.bsky.embed.recordWithMedia#view',
}
for (const [kind, rec] of Object.entries(kinds)) {
  const p = await carol.agent.post({ ...rec, createdAt: now() })
  const { thread: t, spliced } = await thread(carol, p.uri, p.cid)
  assert.ok(spliced, `${kind}: the thread was built by Bulwark`)
  assert.equal(t.post.embed?.$type, embedType[kind], `${kind}: embed ${JSON.stringify(t.post.embed)}`)
  made[kind] = { ...p, spliced: t }
}
assert.equal(made.video.spliced.post.embed.cid, vb.blob.ref.toString())
assert.equal(made.quote.spliced.post.embed.record.uri, davePost.uri)
assert.equal(made.quote.spliced.post.embed.record.author.did, dave.did)
assert.equal(made.replyToDave.spliced.parent?.post?.uri, davePost.uri)
assert.equal(made.replyToOlder.spliced.parent?.post?.uri, older.uri)
const olderThread = await thread(carol, older.uri, older.cid)
assert.ok(olderThread.spliced && replyURIs(olderThread.thread).includes(made.replyToOlder.uri), 'the older post\'s thread has the new reply')
console.log(`behind: getPostThread of a video, image, quote, quote-with-image post and two replies: 200, spliced, embeds ${Object.values(embedType).join(', ')}`)

const newest = [...Object.values(made)].reverse().map((p) => p.uri)
const feed = await carol.view.app.bsky.feed.getAuthorFeed({ actor: carol.handle })
assert.ok(feed.headers[LAG] !== undefined, 'author feed spliced')
assert.deepEqual(feed.data.feed.slice(0, newest.length).map((it) => it.post.uri), newest, 'author feed starts with the new posts, newest first')
const media = await carol.view.app.bsky.feed.getAuthorFeed({ actor: carol.did, filter: 'posts_with_media' })
assert.deepEqual(media.data.feed.map((it) => it.post.uri).slice(0, 2), [made.quoteWithImage.uri, made.image.uri])
const videos = await carol.view.app.bsky.feed.getAuthorFeed({ actor: carol.did, filter: 'posts_with_video' })
assert.equal(videos.data.feed[0]?.post.uri, made.video.uri)
const timeline = await carol.view.app.bsky.feed.getTimeline({})
const tl = timeline.data.feed.map((it) => it.post.uri)
for (const uri of newest) assert.ok(tl.includes(uri), `timeline has ${uri}`)
console.log('behind: getAuthorFeed (all, posts_with_media, posts_with_video) and getTimeline have the new posts')

// 3. Caught up.
await ingest('start')
const real = {}
await eventually('app view has the posts made while behind', async () => {
  const { data } = await direct.app.bsky.feed.getPosts({ uris: Object.values(made).map((p) => p.uri) })
  assert.equal(data.posts.length, Object.keys(made).length)
  for (const post of data.posts) real[post.uri] = post
})
for (const [kind, p] of Object.entries(made)) {
  compare(kind, p.spliced.post, real[p.uri])
}
const after = await thread(carol, made.video.uri, made.video.cid)
assert.ok(!after.spliced, 'once caught up, the app view answers')
assert.deepEqual(after.thread.post.embed, real[made.video.uri].embed)
console.log(`caught up: the app view's own views of the ${Object.keys(made).length} posts agree with Bulwark's spliced ones`)
console.log(`appflow check ok in ${Date.now() - started} ms`)

// compare checks that a spliced post view says what the app view's own
// view of the post says. Counts, labels, viewer state and image URLs are
// the app view's own (Bulwark's image URLs point at its getBlob).
function compare(kind, spliced, appView) {
  const msg = (what) => `${kind}: ${what}: spliced ${JSON.stringify(spliced)} app view ${JSON.stringify(appView)}`
  for (const k of ['uri', 'cid']) assert.equal(spliced[k], appView[k], msg(k))
  assert.deepEqual(spliced.record, appView.record, msg('record'))
  for (const k of ['did', 'handle', 'displayName']) assert.equal(spliced.author[k], appView.author[k], msg(`author.${k}`))
  compareEmbed(spliced.embed, appView.embed, msg)
}

function compareEmbed(s, a, msg) {
  if (s === undefined && a === undefined) return
  assert.equal(s?.$type, a?.$type, msg('embed type'))
  switch (s.$type) {
    case 'app.bsky.embed.video#view':
      assert.deepEqual(s, a, msg('video view'))
      break
    case 'app.bsky.embed.images#view':
      assert.equal(s.images.length, a.images.length, msg('images'))
      s.images.forEach((img, i) => {
        assert.equal(img.alt, a.images[i].alt, msg('alt'))
        assert.deepEqual(img.aspectRatio, a.images[i].aspectRatio, msg('aspect ratio'))
      })
      break
    case 'app.bsky.embed.record#view':
      compareQuoted(s.record, a.record, msg)
      break
    case 'app.bsky.embed.recordWithMedia#view':
      // Its record is a ref, not a union: $type is optional there.
      compareQuoted(s.record.record, a.record.record, msg)
      compareEmbed(s.media, a.media, msg)
      break
  }
}

function compareQuoted(s, a, msg) {
  assert.equal(s.$type, a.$type, msg('quoted record type'))
  for (const k of ['uri', 'cid']) assert.equal(s[k], a[k], msg(`quoted ${k}`))
  assert.equal(s.author.did, a.author.did, msg('quoted author'))
  assert.equal(s.author.handle, a.author.handle, msg('quoted handle'))
  assert.deepEqual(s.value, a.value, msg('quoted value'))
}
