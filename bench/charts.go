package bench

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// A Chart is one figure of a benchmark, drawn as an SVG file by
// WriteCharts: either the distributions of Series as cumulative
// distribution functions (the fraction of samples at or under each
// latency: the whole distribution in one line per case, medians and tails
// readable at a glance, cases of different sample counts comparable), or,
// when Bars is set, one bar per figure for what was measured once.
type Chart struct {
	// File is the file name in the charts directory ("start.svg").
	File  string
	Title string
	// Series are the cases, sandboxd's and the bare runtime's baselines
	// (drawn dashed, in grey tones) side by side.
	Series []Series
	// Bars, when set, replaces the distributions: one horizontal bar per
	// figure, in Unit.
	Bars []Bar
	// Trend, when set, replaces the distributions: the values in the
	// order they were measured, the n-th at x = n, in Unit; XLabel names
	// what n counts.
	Trend  []float64
	XLabel string
	// Unit labels the values' axis (default "ms").
	Unit string
}

// Series is one case's latency samples in milliseconds.
type Series struct {
	Name string
	// Baseline marks the bare runtime's figure, the one sandboxd's are
	// compared with.
	Baseline bool
	// Samples are the measurements.
	Samples []float64
}

// Bar is one figure of a bar chart.
type Bar struct {
	Name     string
	Value    float64
	Baseline bool
}

// WriteCharts draws each chart as an SVG file in dir (made if missing) and
// returns the files' paths. A chart with nothing to draw (a phase that was
// not measured) is skipped.
func WriteCharts(dir string, charts []Chart) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("charts: %w", err)
	}
	var paths []string
	for _, c := range charts {
		p, err := c.plot()
		if err != nil {
			return paths, fmt.Errorf("chart %s: %w", c.File, err)
		}
		if p == nil {
			continue
		}
		path := filepath.Join(dir, c.File)
		f, err := os.Create(path)
		if err != nil {
			return paths, fmt.Errorf("chart %s: %w", c.File, err)
		}
		width, height := c.size()
		err = writeSVG(f, p, width, height)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return paths, fmt.Errorf("chart %s: %w", c.File, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// Write draws the chart as SVG to w.
func (c Chart) Write(w io.Writer) error {
	p, err := c.plot()
	if err != nil {
		return err
	}
	if p == nil {
		return errors.New("nothing to draw")
	}
	width, height := c.size()
	return writeSVG(w, p, width, height)
}

// size is a chart's width and height: taller with more cases to draw, for
// their legend.
func (c Chart) size() (w, h vg.Length) {
	cases := 0
	for _, s := range c.Series {
		if len(s.Samples) > 0 && len(c.Bars) == 0 {
			cases++
		}
	}
	return 8 * vg.Inch, 4.5*vg.Inch + vg.Length(max(0, cases-4))*0.2*vg.Inch
}

func writeSVG(w io.Writer, p *plot.Plot, width, height vg.Length) error {
	wt, err := p.WriterTo(width, height, "svg")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// caseColor tells sandboxd's cases apart; baselines take greys
// (baseColor), so that sandboxd's own stand out and the reference stays
// recognisable in every chart.
func caseColor(i int) color.Color {
	p := [...]color.RGBA{
		{0x4e, 0x79, 0xa7, 0xff}, {0xf2, 0x8e, 0x2b, 0xff}, {0xe1, 0x57, 0x59, 0xff}, {0x59, 0xa1, 0x4f, 0xff},
		{0xb0, 0x7a, 0xa1, 0xff}, {0x76, 0xb7, 0xb2, 0xff}, {0xed, 0xc9, 0x48, 0xff}, {0x9c, 0x75, 0x5f, 0xff},
	}
	return p[i%len(p)]
}

func baseColor(i int) color.Color {
	g := [...]color.Gray{{0x30}, {0x80}, {0xa8}}
	return g[i%len(g)]
}

// plot builds the chart; nil when it has nothing to draw.
func (c Chart) plot() (*plot.Plot, error) {
	if len(c.Bars) > 0 {
		return c.barPlot()
	}
	if len(c.Trend) > 0 {
		return c.trendPlot()
	}
	var series []Series
	for _, s := range c.Series {
		if len(s.Samples) > 0 {
			series = append(series, s)
		}
	}
	if len(series) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.unit() + " (log scale)"
	p.Y.Label.Text = "fraction of samples ≤ x"
	// The legend goes in headroom above 1, where no curve reaches, so
	// that it hides none of them; the axis is labelled up to 1 only.
	_, h := c.size()
	// Each legend row takes about 13 points of the ≈ h-60 the data area has.
	room := float64(13*len(series)+12) / (h.Points() - 60)
	p.Y.Min, p.Y.Max = 0, 1/(1-math.Min(room, 0.6))
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{
		{Value: 0, Label: "0"}, {Value: 0.25, Label: "0.25"}, {Value: 0.5, Label: "0.5"},
		{Value: 0.75, Label: "0.75"}, {Value: 1, Label: "1"},
	})
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Add(plotter.NewGrid())
	// Latencies of one chart span decades (a warm start in a
	// millisecond, a cold one in hundreds): a log axis keeps both legible.
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	lo, hi := math.Inf(1), math.Inf(-1)
	nCase, nBase := 0, 0
	for _, s := range series {
		xs := slices.Clone(s.Samples)
		slices.Sort(xs)
		// A log axis has no zero: a sample rounded to 0 ms is drawn at a
		// microsecond.
		for i := range xs {
			xs[i] = math.Max(xs[i], 0.001)
		}
		lo, hi = math.Min(lo, xs[0]), math.Max(hi, xs[len(xs)-1])
		pts := make(plotter.XYs, 0, len(xs)+1)
		pts = append(pts, plotter.XY{X: xs[0], Y: 0})
		for i, x := range xs {
			pts = append(pts, plotter.XY{X: x, Y: float64(i+1) / float64(len(xs))})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		l.StepStyle = plotter.PostStep
		l.Width = vg.Points(1.5)
		if s.Baseline {
			l.Color = baseColor(nBase)
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			nBase++
		} else {
			l.Color = caseColor(nCase)
			nCase++
		}
		p.Add(l)
		p.Legend.Add(legend(s.Name, xs), l)
	}
	// Room on both sides of the samples, and at least a decade shown, so
	// that the log ticks have labels.
	p.X.Min, p.X.Max = lo/1.5, hi*1.5
	if p.X.Max/p.X.Min < 10 {
		mid := math.Sqrt(p.X.Min * p.X.Max)
		p.X.Min, p.X.Max = mid/math.Sqrt(10), mid*math.Sqrt(10)
	}
	return p, nil
}

// legend names a case with its sample count and median.
func legend(name string, sorted []float64) string {
	med := sorted[(len(sorted)-1)/2]
	return fmt.Sprintf("%s (n=%d, p50 %s %s)", name, len(sorted), figure(med), "ms")
}

// figure prints a value with three significant digits at most.
func figure(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func (c Chart) unit() string {
	if c.Unit == "" {
		return "ms"
	}
	return c.Unit
}

// barPlot draws one horizontal bar per figure, its value at its end.
func (c Chart) barPlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.unit()
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	// Bars from the top down in the given order: plotter counts rows
	// from the bottom.
	n := len(c.Bars)
	names := make([]string, n)
	top := 0.0
	for i, b := range c.Bars {
		row := n - 1 - i
		names[row] = b.Name
		vals := make(plotter.Values, n)
		vals[row] = b.Value
		bars, err := plotter.NewBarChart(vals, vg.Points(18))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name, err)
		}
		bars.Horizontal = true
		bars.LineStyle.Width = 0
		if b.Baseline {
			bars.Color = baseColor(1)
		} else {
			bars.Color = caseColor(0)
		}
		p.Add(bars)
		lbl, err := plotter.NewLabels(plotter.XYLabels{
			XYs:    []plotter.XY{{X: b.Value, Y: float64(row)}},
			Labels: []string{" " + figure(b.Value)},
		})
		if err != nil {
			return nil, err
		}
		for j := range lbl.TextStyle {
			lbl.TextStyle[j].YAlign = draw.YCenter
		}
		p.Add(lbl)
		top = math.Max(top, b.Value)
	}
	p.NominalY(names...)
	// Half a row of room above and below, so that no bar touches an axis.
	p.Y.Min, p.Y.Max = -0.7, float64(n)-0.3
	// Room for the value printed after the longest bar.
	p.X.Max = math.Max(top*1.2, 1)
	return p, nil
}

// logTicks marks a log axis at 1, 2 and 5 times each power of ten (only
// the powers over more than three decades), with unlabelled ticks between:
// plot.LogTicks labels powers of ten only, which leaves a chart whose
// samples span less than a decade with one label or none.
type logTicks struct{}

// Ticks returns the ticks between lo and hi.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	e0, e1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	var ts []plot.Tick
	for e := e0; e <= e1; e++ {
		for m := 1.0; m <= 9; m++ {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || (e1-e0 <= 3 && (m == 2 || m == 5)) {
				t.Label = strconv.FormatFloat(v, 'g', 4, 64)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// trendPlot draws the values by their order, to show a drift (do starts
// slow down as a host fills?).
func (c Chart) trendPlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.unit()
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	pts := make(plotter.XYs, len(c.Trend))
	for i, v := range c.Trend {
		pts[i] = plotter.XY{X: float64(i + 1), Y: v}
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return nil, err
	}
	sc.Color = caseColor(0)
	sc.Radius = vg.Points(1.5)
	p.Add(sc)
	return p, nil
}
