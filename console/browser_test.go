package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/internal/browsertest"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// chrome is a headless Chromium tab recording every request it makes.
type chrome struct {
	t    *testing.T
	ctx  context.Context
	mu   sync.Mutex
	urls []string
	// shots, when set (BULWARK_CONSOLE_SCREENSHOTS), is where each checked
	// page's screenshot is written, for a person to look at.
	shots string
	n     int
}

func newChrome(t *testing.T) *chrome {
	t.Helper()
	ctx := browsertest.New(t)
	c := &chrome{t: t, ctx: ctx, shots: os.Getenv("BULWARK_CONSOLE_SCREENSHOTS")}
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			c.mu.Lock()
			c.urls = append(c.urls, e.Request.URL)
			c.mu.Unlock()
		}
	}))
	return c
}

func (c *chrome) do(steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	require.NoError(c.t, chromedp.Do(c.ctx, steps...))
}

// status runs steps that load a page and returns its HTTP status.
func (c *chrome) status(steps ...chromedp.Action[chromedp.Void]) int64 {
	c.t.Helper()
	resp, err := chromedp.RunResponse(c.ctx, steps...)
	require.NoError(c.t, err)
	return resp.Status
}

func (c *chrome) text(sel string) string {
	c.t.Helper()
	s, err := chromedp.Run(c.ctx, chromedp.Text(sel, chromedp.NodeVisible))
	require.NoError(c.t, err)
	return s
}

// a11y is what checkPage finds on a page.
type a11y struct {
	H1         int      `json:"h1"`
	Unlabeled  []string `json:"unlabeled"`
	Positive   int      `json:"positive"`
	Lang       string   `json:"lang"`
	Focusables []string `json:"focusables"`
	Active     int      `json:"active"`
}

const a11yScript = `(() => {
  const focusables = [...document.querySelectorAll('a[href], button, input:not([type=hidden]), select, textarea')]
    .filter(e => !e.disabled);
  const unlabeled = [];
  for (const el of document.querySelectorAll('input:not([type=hidden]), select, textarea')) {
    const byFor = el.id && document.querySelector('label[for="' + el.id + '"]');
    if (!byFor && !el.closest('label') && !el.getAttribute('aria-label')) unlabeled.push(el.name || el.outerHTML);
  }
  return {
    h1: document.querySelectorAll('h1').length,
    unlabeled,
    positive: [...document.querySelectorAll('[tabindex]')].filter(e => e.tabIndex > 0).length,
    lang: document.documentElement.lang,
    focusables: focusables.map(e => e.outerHTML.slice(0, 120)),
    active: focusables.indexOf(document.activeElement),
  };
})()`

// checkPage checks the page shown for basic accessibility: one h1, a label
// for every field, a language, no positive tabindex, and that Tab moves
// through the links and controls in document order.
func (c *chrome) checkPage(name string) {
	c.t.Helper()
	got, err := chromedp.Run(c.ctx, chromedp.Evaluate[a11y](a11yScript))
	require.NoError(c.t, err)
	require.Equal(c.t, 1, got.H1, "%s: one h1", name)
	require.Empty(c.t, got.Unlabeled, "%s: fields without a label", name)
	require.Zero(c.t, got.Positive, "%s: positive tabindex", name)
	require.Equal(c.t, "en", got.Lang, name)
	at := got.Active
	for range min(6, len(got.Focusables)-at-1) {
		c.do(chromedp.KeyEvent(kb.Tab))
		now, err := chromedp.Run(c.ctx, chromedp.Evaluate[a11y](a11yScript))
		require.NoError(c.t, err)
		require.Equal(c.t, at+1, now.Active, "%s: Tab from %q should reach %q", name, got.Focusables[max(at, 0)], got.Focusables[at+1])
		at = now.Active
	}
	if c.shots != "" {
		png, err := chromedp.Run(c.ctx, chromedp.FullScreenshot(100))
		require.NoError(c.t, err)
		c.n++
		require.NoError(c.t, os.WriteFile(filepath.Join(c.shots, fmt.Sprintf("%02d-%s.png", c.n, name)), png, 0o644))
	}
}

// requests are the URLs the tab asked for so far.
func (c *chrome) requests() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.urls...)
}

// TestBrowserRepairsStuckRelay drives the console in headless Chromium as
// an operator would: log in, see the relay stuck on an oversized event on
// the overview, open the event, rewrite it as #sync through the
// confirmation page, and see the relay healthy again. A form posted without
// its CSRF token is refused, every page passes basic accessibility checks,
// and nothing is requested from another host.
func TestBrowserRepairsStuckRelay(t *testing.T) {
	br := newChrome(t)
	var relay *frameRelay
	e := newEnv(t, envOptions{disableOversizeSync: true, watch: func(e *env) *relaywatch.Watch {
		relay = newFrameRelay(t, e.host)
		head, events := console.WatchSources(e.log)
		w, err := relaywatch.New(relaywatch.Config{
			Hostname: e.host, Relays: []string{relay.URL}, Head: head, Events: events,
			StuckChecks: 2, StuckFor: time.Millisecond, Client: relay.Client(), Logger: quiet,
		})
		require.NoError(t, err)
		return w
	}})
	_, bad := e.newRepo(t, "grace.test")
	e.inflate(t, bad, 5_100_000)
	relay.follow(t, "ws://"+e.host+"/xrpc/com.atproto.sync.subscribeRepos", bad-1)
	require.Eventually(t, func() bool {
		for _, c := range e.hub.Health().Consumers() {
			if c.Stuck != nil && c.Stuck.Event != nil {
				return true
			}
		}
		return false
	}, waitLimit, 10*time.Millisecond, "the relay drops the oversized frame and redials at the same cursor")
	e.sampler.Sample(context.Background())
	e.sampler.Sample(context.Background())

	// Log in: the overview asks for it.
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Navigate(e.url+console.Prefix)))
	br.do(chromedp.WaitVisible(`#password`))
	br.checkPage("login")
	br.do(chromedp.SendKeys(`#password`, adminPassword))
	st := br.status(chromedp.Click(`form.login button[type=submit]`, chromedp.NodeVisible))
	require.Equal(t, int64(http.StatusOK), st, br.text(`main`))
	br.do(chromedp.WaitVisible(`#relays`))

	// Two checks at the same seq while a newer event waits: stuck.
	check := `form[action="/admin/relays/check"] button`
	for range 2 {
		require.Equal(t, int64(http.StatusOK), br.status(chromedp.Click(check, chromedp.NodeVisible)))
	}
	br.do(chromedp.WaitVisible(`tr.state-stuck`))
	consumer := br.text(`section[aria-labelledby=consumers] tr.bad`)
	require.Contains(t, consumer, fmt.Sprint(bad))
	require.Contains(t, consumer, "relays drop the connection above 5000000")
	row := br.text(`tr.state-stuck`)
	require.Contains(t, row, "stuck")
	require.Contains(t, row, fmt.Sprint(bad))
	require.Contains(t, row, "rewrite-as-sync --seq "+fmt.Sprint(bad))
	br.checkPage("overview-stuck")

	// A form posted without its CSRF token is refused.
	br.do(chromedp.Evaluate[chromedp.Void](`document.querySelector('form[action="/admin/relays/check"] input[name=csrf]').remove()`))
	require.Equal(t, int64(http.StatusForbidden), br.status(chromedp.Click(check, chromedp.NodeVisible)))
	require.Contains(t, br.text(`main`), "no valid CSRF token")
	br.checkPage("csrf-refused")

	// Open the event the relay cannot pass, and repair it.
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Navigate(e.url+console.Prefix)))
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Click(`tr.state-stuck a[href$="/firehose/event/`+fmt.Sprint(bad)+`"]`, chromedp.NodeVisible)))
	require.Contains(t, br.text(`main`), "relays drop the connection above 5000000")
	br.checkPage("event")
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Click(`a[href$="confirm?action=rewrite"]`, chromedp.NodeVisible)))
	require.Contains(t, br.text(`main`), "is replaced by a #sync")
	br.checkPage("confirm")
	br.do(chromedp.SendKeys(`#reason`, "relay stuck on an oversized commit"))
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Click(`main form button[type=submit]`, chromedp.NodeVisible)))
	require.Contains(t, br.text(`p.ok`), "Done")
	br.checkPage("repaired")
	evs, err := e.log.Inspect(context.Background(), eventlog.EventFilter{FromSeq: bad, ToSeq: bad})
	require.NoError(t, err)
	require.Equal(t, eventlog.KindSync, evs[0].Kind)

	// The relay reads the #sync and moves on; the next check finds it
	// healthy.
	require.Eventually(t, func() bool { return relay.cursor.Load() >= bad }, waitLimit, 10*time.Millisecond, "the relay advances after the repair")
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Navigate(e.url+console.Prefix)))
	require.Equal(t, int64(http.StatusOK), br.status(chromedp.Click(check, chromedp.NodeVisible)))
	br.do(chromedp.WaitVisible(`tr.state-healthy`))
	require.Contains(t, br.text(`tr.state-healthy`), "healthy")
	br.checkPage("overview-healthy")

	for _, u := range br.requests() {
		require.True(t, strings.HasPrefix(u, e.url+"/") || strings.HasPrefix(u, "data:"), "request to another host: %s", u)
	}
	require.NotEmpty(t, br.requests())
}
