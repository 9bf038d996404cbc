// End-to-end check with the reference client library, @atproto/api: the
// calls a Bluesky client makes to its PDS. Run by scripts/atproto-api.sh.
import assert from 'node:assert/strict'
import { AtpAgent } from '@atproto/api'
const service = process.argv[2]
const handle = 'api' + Date.now() % 100000 + '.test'
const agent = new AtpAgent({ service })
const created = await agent.createAccount({ handle, email: handle + '@example.com', password: 'api-e2e-password' })
console.log('createAccount', created.data.did, created.data.handle)
const agent2 = new AtpAgent({ service })
await agent2.login({ identifier: handle, password: 'api-e2e-password' })
console.log('login', agent2.session.did, 'active', agent2.session.active)
const post = await agent2.post({ text: 'hello from @atproto/api', createdAt: new Date().toISOString() })
console.log('post', post.uri, post.cid)
const rec = await agent2.com.atproto.repo.getRecord({ repo: agent2.session.did, collection: 'app.bsky.feed.post', rkey: post.uri.split('/').pop() })
assert.equal(rec.data.value.text, 'hello from @atproto/api')
console.log('getRecord', rec.data.value.text)
const put = await agent2.com.atproto.repo.putRecord({ repo: agent2.session.did, collection: 'app.bsky.actor.profile', rkey: 'self', record: { $type: 'app.bsky.actor.profile', displayName: 'API Test' } })
assert.equal(put.data.validationStatus, 'valid')
console.log('putRecord', put.data.uri, put.data.validationStatus)
const list = await agent2.com.atproto.repo.listRecords({ repo: agent2.session.did, collection: 'app.bsky.feed.post' })
console.log('listRecords', list.data.records.length)
const desc = await agent2.com.atproto.repo.describeRepo({ repo: handle })
assert.deepEqual(desc.data.collections, ['app.bsky.actor.profile', 'app.bsky.feed.post'])
console.log('describeRepo', desc.data.collections)
await agent2.deletePost(post.uri)
console.log('deletePost ok')
const aw = await agent2.com.atproto.repo.applyWrites({ repo: agent2.session.did, writes: [
  { $type: 'com.atproto.repo.applyWrites#create', collection: 'app.bsky.feed.like', value: { $type: 'app.bsky.feed.like', subject: { uri: put.data.uri, cid: put.data.cid }, createdAt: new Date().toISOString() } },
] })
console.log('applyWrites', aw.data.results[0].$type, aw.data.results[0].validationStatus)
await agent2.sessionManager.refreshSession()
console.log('refresh ok')
const app = await agent2.com.atproto.server.createAppPassword({ name: 'test' })
console.log('appPassword', app.data.name)
const sess = await agent2.com.atproto.server.getSession()
console.log('getSession', sess.data.handle, sess.data.email)
const stale = agent2.session.accessJwt
await agent2.logout()
console.log('logout ok')
// The ended session's access token is refused at once, not in 2 hours.
const res = await fetch(service + '/xrpc/com.atproto.server.getSession', { headers: { Authorization: 'Bearer ' + stale } })
assert.equal(res.status, 400)
assert.equal((await res.json()).error, 'InvalidToken')
console.log('e2e ok')
