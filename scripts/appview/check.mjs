// What a person does on Bulwark shows up in the reference app view: two
// accounts; one sets a profile, posts twice and follows the other, who posts
// once. Run by scripts/appview.sh.
//
// Usage: node check.mjs PDS_URL APPVIEW_URL APPVIEW_DID [--via-pds]
//
// Always: polls the app view directly (unauthenticated getProfile and
// getAuthorFeed) until it has indexed everything from Bulwark's firehose.
// With --via-pds: the same reads, and the timeline, through Bulwark with the
// logged-in agent (Bulwark proxies app.bsky.* to the app view with a
// service-auth token): once without an atproto-proxy header (the default app
// view) and once with `APPVIEW_DID#bsky_appview`, as the Bluesky app sends.
import assert from 'node:assert/strict'
import { setTimeout as delay } from 'node:timers/promises'
import { AtpAgent } from '@atproto/api'

const [pds, appview, appviewDid] = process.argv.slice(2, 5)
const viaPds = process.argv.includes('--via-pds')
if (!pds || !appview || !appviewDid) {
  console.error('usage: node check.mjs PDS_URL APPVIEW_URL APPVIEW_DID [--via-pds]')
  process.exit(2)
}
const started = Date.now()
const DEADLINE_MS = 60_000

// eventually retries fn until it stops throwing; the app view indexes in
// another process, so polling with a deadline is the only way to wait.
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

async function account(name) {
  const suffix = String(Date.now() % 1_000_000)
  const handle = `${name}${suffix}.test`
  const password = `appview-check-${name}`
  const agent = new AtpAgent({ service: pds })
  await agent.createAccount({ handle, email: `${handle}@example.com`, password })
  return { agent, handle, did: agent.session.did }
}

const alice = await account('alice')
const bob = await account('bob')
console.log('accounts', alice.did, alice.handle, bob.did, bob.handle)

await alice.agent.com.atproto.repo.putRecord({
  repo: alice.did,
  collection: 'app.bsky.actor.profile',
  rkey: 'self',
  record: { $type: 'app.bsky.actor.profile', displayName: 'Alice Appview', description: 'seen through the app view' },
})
const texts = ['first post from Bulwark', 'second post from Bulwark']
const posts = []
for (const text of texts) {
  posts.push(await alice.agent.post({ text, createdAt: new Date().toISOString() }))
}
const follow = await alice.agent.follow(bob.did)
const bobPost = await bob.agent.post({ text: 'bob was here', createdAt: new Date().toISOString() })
console.log('wrote profile, posts', posts.map((p) => p.uri).join(' '), 'follow', follow.uri, 'bob post', bobPost.uri)

// checkProfile asserts what the app view must say about alice; viewer state
// is only there when the request was authenticated as alice.
function checkAliceProfile(p) {
  assert.equal(p.did, alice.did)
  assert.equal(p.handle, alice.handle, 'handle verified (not handle.invalid)')
  assert.equal(p.displayName, 'Alice Appview')
  assert.equal(p.postsCount, 2)
  assert.equal(p.followsCount, 1)
}

function checkAliceFeed(feed) {
  const got = feed.map((item) => item.post.record.text).sort()
  assert.deepEqual(got, [...texts].sort())
  for (const item of feed) {
    assert.equal(item.post.author.did, alice.did)
    assert.equal(item.post.author.displayName, 'Alice Appview')
  }
}

// (a) Straight to the app view, no auth: proves ingestion of Bulwark's
// firehose (commits, identity, handle verification).
const direct = new AtpAgent({ service: appview })
const profile = await eventually('app view getProfile', async () => {
  const { data } = await direct.app.bsky.actor.getProfile({ actor: alice.did })
  checkAliceProfile(data)
  return data
})
console.log('app view getProfile', profile.handle, JSON.stringify(profile.displayName), 'posts', profile.postsCount, 'follows', profile.followsCount, `after ${Date.now() - started} ms`)
const byHandle = await direct.app.bsky.actor.getProfile({ actor: alice.handle })
assert.equal(byHandle.data.did, alice.did)
await eventually('app view getAuthorFeed', async () => {
  const { data } = await direct.app.bsky.feed.getAuthorFeed({ actor: alice.did })
  checkAliceFeed(data.feed)
})
console.log('app view getAuthorFeed', texts.length, 'posts')
await eventually('app view bob', async () => {
  const { data } = await direct.app.bsky.actor.getProfile({ actor: bob.handle })
  assert.equal(data.did, bob.did)
  assert.equal(data.followersCount, 1)
  assert.equal(data.postsCount, 1)
})
console.log('app view getProfile bob: 1 follower, 1 post')

// (b) Through Bulwark, authenticated as alice: Bulwark signs a service-auth
// token (iss alice, aud the app view's DID, lxm the method) and forwards.
if (viaPds) {
  const viaHeader = alice.agent.withProxy('bsky_appview', appviewDid)
  for (const [name, agent] of [['default app view', alice.agent], ['atproto-proxy header', viaHeader]]) {
    const p = await agent.app.bsky.actor.getProfile({ actor: alice.did })
    checkAliceProfile(p.data)
    const b = await agent.app.bsky.actor.getProfile({ actor: bob.did })
    // viewer.following is set only when the app view took the token as
    // alice's: the service auth round trip worked.
    assert.equal(b.data.viewer?.following, follow.uri)
    const feed = await agent.app.bsky.feed.getAuthorFeed({ actor: alice.handle })
    checkAliceFeed(feed.data.feed)
    const tl = await agent.app.bsky.feed.getTimeline({})
    const uris = tl.data.feed.map((item) => item.post.uri)
    for (const uri of [...posts.map((p) => p.uri), bobPost.uri]) {
      assert.ok(uris.includes(uri), `timeline has ${uri}: ${uris.join(' ')}`)
    }
    console.log(`via Bulwark (${name}): getProfile, viewer.following, getAuthorFeed, getTimeline (${uris.length} posts)`)
  }
}
console.log(`appview check ok (${viaPds ? 'direct and via Bulwark' : 'direct'}) in ${Date.now() - started} ms`)
