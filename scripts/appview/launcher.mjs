// Starts the reference Bluesky app view (@atproto/bsky) against a local PDS,
// wired the way @atproto/dev-env's TestBsky does: a Postgres-backed data plane
// in process, the app view's HTTP server, and a repo subscription that
// ingests the PDS's firehose. Everything stays on loopback: the PLC, the PDS,
// Postgres and the two servers this process opens.
//
// It registers a service DID of its own in the PLC (a genesis operation
// signed by a key made here; #atproto is that key and #bsky_appview and
// #bsky_notif point at this server) and writes {"did", "url"} to --out once
// it serves, so that the PDS can be started with that DID as its app view.
// The file also names a control URL on loopback that stops and starts the
// ingestion, for checks that need the app view to lag on purpose.
//
// Usage: node launcher.mjs --plc PLC_URL --pds PDS_URL --port N --db PG_URL
//   --out FILE [--handle-domains .test,...]
// PDS_URL is the PDS's http:// base; its firehose is the same host over ws://.
// Handles under the domains are resolved by asking the PDS for
// /.well-known/atproto-did with the handle as the Host header, as dev-env's
// mock resolvers do: .test names have no DNS.
import { writeFileSync, renameSync } from 'node:fs'
import http from 'node:http'
import { setTimeout as delay } from 'node:timers/promises'
import { parseArgs } from 'node:util'
import { randomBytes } from 'node:crypto'
import {
  BskyAppView,
  DataPlaneServer,
  Database,
  RepoSubscription,
  ServerConfig,
} from '@atproto/bsky'
import { Secp256k1Keypair } from '@atproto/crypto'
import * as plc from '@did-plc/lib'

const { values: opts } = parseArgs({
  options: {
    plc: { type: 'string' },
    pds: { type: 'string' },
    port: { type: 'string' },
    db: { type: 'string' },
    out: { type: 'string' },
    'handle-domains': { type: 'string', default: '.test' },
  },
})
for (const k of ['plc', 'pds', 'port', 'db', 'out']) {
  if (!opts[k]) {
    console.error(`launcher: --${k} is required`)
    process.exit(2)
  }
}
const port = Number(opts.port)
const url = `http://127.0.0.1:${port}`
const pdsHttp = new URL(opts.pds)
const firehose = `${pdsHttp.protocol === 'https:' ? 'wss' : 'ws'}://${pdsHttp.host}`
const handleDomains = opts['handle-domains'].split(',').map((d) => d.trim()).filter(Boolean)

// express's app.listen(port) binds every interface; bsky and its data plane
// call it with a port only. Bind those to loopback: nothing here is for the
// network.
const listen = http.Server.prototype.listen
http.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' && (args.length === 1 || typeof args[1] === 'function')) {
    args.splice(1, 0, '127.0.0.1')
  }
  return listen.apply(this, args)
}

// The service identity: one genesis operation, so the DID document is exactly
// this (no atproto_pds entry, no handle).
async function createServiceDid(plcUrl, key) {
  const op = await plc.signOperation(
    {
      type: 'plc_operation',
      rotationKeys: [key.did()],
      verificationMethods: { atproto: key.did() },
      alsoKnownAs: [],
      services: {
        bsky_appview: { type: 'BskyAppView', endpoint: url },
        bsky_notif: { type: 'BskyNotificationService', endpoint: url },
      },
      prev: null,
    },
    key,
  )
  const did = await plc.didForCreateOp(op)
  await new plc.Client(plcUrl).sendOperation(did, op)
  return did
}

// resolveHandleViaPds answers for handles under the PDS's domains by asking
// the PDS itself; anything else is left to the resolver's own DNS/HTTPS path.
function resolveHandleViaPds(handleResolver) {
  const orig = handleResolver.resolve.bind(handleResolver)
  handleResolver.resolve = async (handle) => {
    if (!handleDomains.some((d) => handle.endsWith(d))) return orig(handle)
    return new Promise((resolve) => {
      const req = http.get(
        {
          host: pdsHttp.hostname,
          port: pdsHttp.port,
          path: '/.well-known/atproto-did',
          headers: { host: handle },
          timeout: 3000,
        },
        (res) => {
          let body = ''
          res.setEncoding('utf8')
          res.on('data', (c) => {
            if (body.length < 2048) body += c
          })
          res.on('end', () => {
            const did = body.split('\n')[0].trim()
            resolve(res.statusCode === 200 && did.startsWith('did:') ? did : undefined)
          })
          res.on('error', () => resolve(undefined))
        },
      )
      req.on('timeout', () => req.destroy())
      req.on('error', () => resolve(undefined))
    })
  }
}

const started = Date.now()
const key = await Secp256k1Keypair.create()
const serverDid = await createServiceDid(opts.plc, key)

// Migrations on their own connection, as dev-env does; the shared pool
// serves the data plane and the ingester.
const migrationDb = new Database({ url: opts.db, schema: 'bsky' })
await migrationDb.migrateToLatestOrThrow()
await migrationDb.close()
const db = new Database({ url: opts.db, schema: 'bsky', poolSize: 10 })

// Port 0: the data plane is only reached from this process. Its resolver
// gets the plain fetch: the default one refuses http:// and loopback.
const dataplane = await DataPlaneServer.create(db, 0, opts.plc, globalThis.fetch)
const dataplanePort = dataplane.server.address().port
resolveHandleViaPds(dataplane.idResolver.handle)

const config = new ServerConfig({
  version: 'bulwark-appview',
  port,
  didPlcUrl: opts.plc,
  publicUrl: url,
  serverDid,
  alternateAudienceDids: [],
  dataplaneUrls: [`http://127.0.0.1:${dataplanePort}`],
  dataplaneHttpVersion: '1.1',
  // No bsync: mutes, bookmarks and notification preferences fail; reads
  // work. Port 9 (discard) on loopback refuses at once.
  bsyncUrl: 'http://127.0.0.1:9',
  bsyncHttpVersion: '1.1',
  modServiceDid: 'did:example:invalidMod',
  labelsFromIssuerDids: [],
  bigThreadUris: new Set(),
  maxThreadParents: 50,
  disableSsrfProtection: true,
  searchTagsHide: new Set(),
  threadTagsBumpDown: new Set(),
  threadTagsHide: new Set(),
  visibilityTagHide: '',
  visibilityTagRankPrefix: '',
  debugFieldAllowedDids: new Set(),
  draftsLimit: 500,
  adminPasswords: [randomBytes(16).toString('hex')],
  etcdHosts: [],
})
const server = BskyAppView.create({ config, signingKey: key })
resolveHandleViaPds(server.ctx.idResolver.handle)
await server.start()

const sub = new RepoSubscription({ service: firehose, db, idResolver: dataplane.idResolver })
const control = await startControl()

const tmp = opts.out + '.tmp'
writeFileSync(tmp, JSON.stringify({ did: serverDid, url, firehose, control }) + '\n')
renameSync(tmp, opts.out)
console.log(`app view ${serverDid} serving at ${url} (started in ${Date.now() - started} ms)`)

// The PDS starts after this process (it needs the DID above). The
// subscription would find it on its own, but it reconnects with exponential
// backoff (1 s, 2 s, 4 s, ... up to 64 s), which can leave it idle for
// seconds after the PDS is up; so subscribe once the PDS answers its health
// check. Later disconnects are the subscription's to retry. It replays from
// cursor 0, so nothing written before it connects is missed.
let stopping = false
process.on('SIGTERM', () => shutdown('SIGTERM'))
process.on('SIGINT', () => shutdown('SIGINT'))
while (!stopping && !(await pdsHealthy())) await delay(200)
if (!stopping) {
  sub.start()
  console.log(`app view: PDS up, ingesting ${firehose} (${Date.now() - started} ms)`)
}

// startControl serves the checks' switch for ingestion, on loopback: POST
// /ingest/stop answers once the subscription is stopped and everything it
// read is indexed, so the app view then stays behind the PDS until POST
// /ingest/start (which replays from cursor 0). That makes "the app view has
// not seen the post yet" a state a check can rely on rather than a race.
async function startControl() {
  const srv = http.createServer(async (req, res) => {
    try {
      if (req.method === 'POST' && req.url === '/ingest/stop') {
        await stopIngesting()
      } else if (req.method === 'POST' && req.url === '/ingest/start') {
        if (!stopping) await sub.start()
      } else {
        res.writeHead(404).end()
        return
      }
      console.log(`app view: ingestion ${sub.running ? 'running' : 'stopped'}`)
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ running: sub.running }))
    } catch (err) {
      console.error('app view: control:', err)
      res.writeHead(500).end()
    }
  })
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve))
  srv.unref()
  return `http://127.0.0.1:${srv.address().port}`
}

// stopIngesting is RepoSubscription.stop without its runner.destroy():
// that clears the per-repository queues, and a task cleared behind a
// running one never settles (p-queue), so destroy() then waits forever
// whenever a repository had several events in flight. Draining instead
// indexes everything the subscription read.
async function stopIngesting() {
  const cur = sub.current
  if (!cur) return
  sub.current = undefined
  await cur.firehose.destroy()
  await cur.runner.processAll()
  await sub.background.processAll()
}

async function pdsHealthy() {
  try {
    const res = await fetch(new URL('/xrpc/_health', pdsHttp), { signal: AbortSignal.timeout(2000) })
    await res.body?.cancel()
    return res.ok
  } catch {
    return false
  }
}

async function shutdown(signal) {
  if (stopping) return
  stopping = true
  console.log(`app view: ${signal}, stopping`)
  const force = setTimeout(() => process.exit(1), 10_000)
  force.unref()
  try {
    await sub.destroy()
    await server.destroy()
    await dataplane.destroy()
    await db.close()
  } catch (err) {
    console.error('app view: stop:', err)
    process.exit(1)
  }
  process.exit(0)
}
