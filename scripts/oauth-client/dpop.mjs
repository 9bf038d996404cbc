// A request with an access token and a DPoP proof made by hand from the
// client's stored key, without the client's retries: what a copy of the
// token held after revocation would get.
import { createHash, createPrivateKey, randomUUID, sign } from 'node:crypto'

const b64url = (buf) => Buffer.from(buf).toString('base64url')

function proof (jwk, method, url, accessToken, nonce) {
  const { d, ...pub } = jwk
  const header = { typ: 'dpop+jwt', alg: 'ES256', jwk: { kty: pub.kty, crv: pub.crv, x: pub.x, y: pub.y } }
  const claims = {
    jti: randomUUID(),
    htm: method,
    htu: url,
    iat: Math.floor(Date.now() / 1000),
    ath: b64url(createHash('sha256').update(accessToken).digest())
  }
  if (nonce) claims.nonce = nonce
  const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`
  const key = createPrivateKey({ key: jwk, format: 'jwk' })
  const sig = sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' })
  return `${input}.${b64url(sig)}`
}

// rawGetSession calls getSession with the stored session's access token
// and key, answering the server's nonce challenge once, and returns the
// final status and WWW-Authenticate header.
export async function rawGetSession (pds, stored) {
  const url = `${pds}/xrpc/com.atproto.server.getSession`
  const token = stored.tokenSet.access_token
  let nonce
  for (let i = 0; i < 2; i++) {
    const res = await fetch(url, {
      headers: { Authorization: `DPoP ${token}`, DPoP: proof(stored.dpopJwk, 'GET', url, token, nonce) }
    })
    await res.arrayBuffer()
    const challenge = res.headers.get('www-authenticate') ?? ''
    if (res.status === 401 && challenge.includes('use_dpop_nonce') && !nonce) {
      nonce = res.headers.get('dpop-nonce')
      continue
    }
    return { status: res.status, challenge }
  }
  throw new Error('the server asked for a nonce twice')
}
