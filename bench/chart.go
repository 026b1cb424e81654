package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// TTIChart draws a report as an SVG bar chart: for each account and mode,
// and for the bare runtime, bars of p50, p95 and p99 in milliseconds.
func TTIChart(w io.Writer, r TTIReport) error {
	type group struct {
		label string
		l     Latency
	}
	groups := make([]group, 0, len(r.Results)+1)
	for _, res := range r.Results {
		groups = append(groups, group{res.Account + " · " + res.Mode, res.Latency})
	}
	groups = append(groups, group{"bare runsc run+exec", r.Baseline})
	top := 1.0
	for _, g := range groups {
		top = math.Max(top, g.l.P99)
	}
	top = niceCeil(top)
	const (
		left, right, upper, lower = 70.0, 20.0, 50.0, 90.0
		groupW, barW, height      = 110.0, 26.0, 300.0
	)
	width := left + right + groupW*float64(len(groups))
	colors := []string{"#4e79a7", "#f28e2b", "#e15759"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, upper+height+lower)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15">Create to first command (%s), ms: p50, p95, p99</text>`+"\n", left, html.EscapeString(strings.Join(r.Command, " ")))
	for i := 0; i <= 5; i++ {
		v := top * float64(i) / 5
		y := upper + height - height*float64(i)/5
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, width-right, y, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, y+4, v)
	}
	for gi, g := range groups {
		x0 := left + groupW*float64(gi) + (groupW-3*barW)/2
		for i, v := range []float64{g.l.P50, g.l.P95, g.l.P99} {
			h := height * v / top
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" fill="%s"><title>%.1f ms</title></rect>`+"\n", x0+barW*float64(i), upper+height-h, barW-2, h, colors[i], v)
		}
		cx := left + groupW*float64(gi) + groupW/2
		parts := strings.SplitN(g.label, " · ", 2)
		for li, line := range parts {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", cx, upper+height+18+14*float64(li), html.EscapeString(line))
		}
		if g.l.N > 0 && g.l.OK < g.l.N {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#e15759">%d/%d ok</text>`+"\n", cx, upper+height+18+14*float64(len(parts)), g.l.OK, g.l.N)
		}
	}
	for i, name := range []string{"p50", "p95", "p99"} {
		x := left + 90*float64(i)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n", x, upper+height+lower-22, colors[i], x+16, upper+height+lower-12, name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
