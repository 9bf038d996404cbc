// Package alert tells the operator of incidents that need a human — a
// stuck relay, a stuck firehose consumer, a storm of refused requests — by
// POSTing JSON to a webhook, so that they hear of it before their users.
//
// Webhook.Send never blocks: alerts wait in a bounded in-memory queue,
// are deduplicated within a window per (kind, subject), or per incident
// when they name one (two detectors seeing one stuck relay send one
// alert), and are delivered by Run with bounded retries and exponential
// backoff. StormDetector counts refusals (503s) per minute and fires once
// per storm.
package alert
