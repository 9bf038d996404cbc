package console

import (
	"fmt"
	"html/template"
	"math"
	"strings"
)

// Sparkline sizes, in SVG user units.
const (
	sparkWidth  = 240
	sparkHeight = 40
)

// sparkline draws values (oldest first; NaN is a gap) as an inline SVG
// polyline scaled to its own maximum, labelled for screen readers. Only
// numbers and the escaped label go into the markup. It uses presentation
// attributes and classes, no style attributes, so the console's CSP holds.
func sparkline(label string, values []float64) template.HTML {
	var b strings.Builder
	esc := template.HTMLEscapeString(label)
	fmt.Fprintf(&b, `<svg class="spark" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s"><title>%s</title>`,
		sparkWidth, sparkHeight, sparkWidth, sparkHeight, esc, esc)
	top := 0.0
	for _, v := range values {
		if !math.IsNaN(v) && v > top {
			top = v
		}
	}
	if len(values) > 1 {
		step := float64(sparkWidth) / float64(len(values)-1)
		var pts []string
		flush := func() {
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="%s"/>`, strings.Join(pts, " "))
				pts = pts[:0]
			}
		}
		for i, v := range values {
			if math.IsNaN(v) {
				flush()
				continue
			}
			y := float64(sparkHeight - 2)
			if top > 0 {
				y = float64(sparkHeight-2) - v/top*float64(sparkHeight-4)
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(i)*step, y))
		}
		flush()
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // numbers and an escaped label only
}
