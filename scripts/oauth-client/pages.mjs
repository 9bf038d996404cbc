// Checks on Bulwark's sign-in pages as a browser shows them: axe-core's
// accessibility rules, a label on every input, one h1, no scripts, and the
// order Tab moves focus in.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const axeSource = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8')

// The pages send a strict CSP (no scripts at all); the checks run through
// the DevTools protocol, which the policy does not cover, so the pages are
// checked exactly as served.
export async function checkPage (page, name, expectedFocus, check) {
  if (process.env.SCREENSHOTS) {
    await page.screenshot({ path: `${process.env.SCREENSHOTS}/${name.replaceAll(' ', '-')}.png`, fullPage: true })
  }
  await page.evaluate(axeSource)
  const violations = await page.evaluate(async () => {
    const r = await axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa', 'best-practice'] } })
    return r.violations.map(v => `${v.id}: ${v.help} at ${v.nodes.map(n => n.target.join(' ')).join(', ')}`)
  })
  check(`${name}: axe-core finds no accessibility violations`, violations.length === 0, violations.join('\n'))

  const facts = await page.evaluate(() => {
    const fields = [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
    return {
      h1: [...document.querySelectorAll('h1')].map(h => h.id),
      unlabelled: fields.filter(f => !(f.labels && f.labels.length) && !f.getAttribute('aria-label')).map(f => f.id || f.name),
      scripts: document.scripts.length
    }
  })
  check(`${name}: exactly one h1, #page-title`, facts.h1.length === 1 && facts.h1[0] === 'page-title', JSON.stringify(facts.h1))
  check(`${name}: every input has a label`, facts.unlabelled.length === 0, facts.unlabelled.join(', '))
  check(`${name}: no scripts`, facts.scripts === 0, `${facts.scripts} scripts`)

  const order = await focusOrder(page, expectedFocus.length)
  check(`${name}: Tab moves focus through ${expectedFocus.join(', ')}`,
    JSON.stringify(order) === JSON.stringify(expectedFocus), `got ${order.join(', ')}`)
}

// focusOrder presses Tab n times from a freshly loaded page and names each
// focused element: its id, or its tag and link target.
async function focusOrder (page, n) {
  const order = []
  for (let i = 0; i < n; i++) {
    await page.keyboard.press('Tab')
    order.push(await page.evaluate(() => {
      const e = document.activeElement
      if (!e || e === document.body) return '(none)'
      if (e.id) return e.id
      const href = e.getAttribute('href')
      return e.tagName.toLowerCase() + (href ? `[href=${href}]` : '')
    }))
  }
  return order
}
