package scopes

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/softrdma/softrdma"
)

// WriteTable prints the results as a text table, one row per scope ×
// policy, after a line describing the set-up, and the targets
// against the mr-scope rows.
func WriteTable(w io.Writer, cfg Config, rs []Result) error {
	cfg = cfg.WithDefaults()
	fmt.Fprintf(w, "scope experiment (%s): %d QPs over %d MRs in %d PDs; MR %s %s, %s WRITEs, window %d; "+
		"MR 0 remapped every %v; per row %v with remaps and %v without, in slices of %v; profile %s\n",
		cfg.Network(), cfg.QPs, cfg.MRs, cfg.PDs, size(cfg.MRSize), cfg.Kind, size(cfg.MsgSize), cfg.Window,
		cfg.Period, cfg.Duration, cfg.Duration, cfg.Slice, cfg.Profile)
	if len(rs) > 0 {
		r := rs[0]
		base := "none"
		if !math.IsNaN(float64(r.BaselineMBps)) {
			base = fmt.Sprintf("%.0f MB/s", float64(r.BaselineMBps))
		}
		fmt.Fprintf(w, "QPs writing MR 0: %d; others: %d in its PD, %d in other PDs; untouched QPs without remaps %s (first row)\n",
			r.Touching, r.UntouchedSame, r.UntouchedElse, base)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scope\tapplied\tpolicy\tremaps\tcrit p50 µs\tcrit p99 µs\tdirty pages\tcopy µs\tcrit−copy p50\tcrit−copy p99\t"+
		"QPs paused\tuntouched ×\tsame PD ×\tother PD ×\twriters ×\tin remap ×\tremap µs\tswitch µs\tduty\tcycles p25–p75\theld\tNAKed\tdropped\tdelayed KiB\t")
	for _, r := range rs {
		applied := r.Applied
		if r.Widened {
			applied += "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f\t%.1f\t%.1f/%d\t%.1f\t%.1f\t%.1f\t%.2f (max %d)\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.1f\t%.0f%%\t%.2f–%.2f\t%d\t%d\t%d\t%.1f\t\n",
			r.Scope, applied, r.Policy, r.Remaps, r.CriticalP50Us, r.CriticalP99Us, r.DirtyPages, r.PagesMoved,
			r.DirtyCopyMean, r.OverheadP50Us, r.OverheadP99Us, r.QPsPausedMean, r.QPsPausedMax,
			ratio(r.Untouched), ratio(r.SamePD), ratio(r.OtherPD), ratio(r.TouchingRatio), ratio(r.UntouchedInRemap),
			r.RemapWallP50Us, r.ViewSwitchP50Us, 100*r.RemapDuty, r.RatioP25, r.RatioP75,
			r.PacketsHeld, r.PacketsNAKed, r.PacketsDropped, r.DelayedPerRmp/1024)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\n× : throughput in the slices with remaps over the slices without, interleaved with them; * : scope widened by the profile.")
	fmt.Fprintln(w, "copy µs: mean per remap of the pages re-copied in the critical section × the median pre-copy time per page (at most the critical section); crit−copy: critical section minus that copy, per remap.")
	fmt.Fprintln(w, "in remap ×: untouched QPs while a remap call runs; remap µs: p50 wall time of the call; duty: share of the run inside remap calls;")
	fmt.Fprintln(w, "switch µs: p50 time after the resume while the NIC writes old and new frames and the view switches;")
	fmt.Fprintln(w, "cycles p25–p75: quartiles of the untouched ratio cycle by cycle (the noise); delayed KiB: bytes delayed per remap.")
	writeHost(w, rs)
	for _, r := range rs {
		if r.Scope != "mr" {
			continue
		}
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "NOT met"
		}
		untouched := ratio(r.Untouched) // "-" when every QP writes MR 0, as in the table
		if !math.IsNaN(float64(r.Untouched)) {
			untouched += "×"
		}
		host := ""
		if !math.IsNaN(float64(r.HostDelayP99Us)) {
			host = fmt.Sprintf("; the host alone delays %.1f µs of work by p99 %.1f µs, %.1f%% of it by >20 µs (above 1%% the p99 target is out of reach on this host; the probe leaves out the experiment's own threads)",
				float64(r.HostWindowUs), float64(r.HostDelayP99Us), 100*float64(r.HostDelayOver20))
		}
		fmt.Fprintf(w, "targets, mr scope, %s: untouched QPs %s (target ≥ %.2f×: %s); critical section minus dirty copy p50 %.1f µs, p99 %.1f µs (target ≤ %d µs: p50 %s, p99 %s)%s\n",
			r.Policy, untouched, TargetUntouchedRatio, untouchedVerdict(r.Untouched),
			r.OverheadP50Us, r.OverheadP99Us, TargetOverheadUs,
			verdict(r.OverheadP50Us <= TargetOverheadUs), verdict(r.OverheadP99Us <= TargetOverheadUs), host)
	}
	return nil
}

// writeHost prints the host probe's lines under the table: what a busy
// thread lost, and the delay the host adds to work as long as each row's
// critical section p50.
func writeHost(w io.Writer, rs []Result) {
	if len(rs) == 0 {
		return
	}
	h := rs[0]
	if h.HostReads == 0 {
		fmt.Fprintln(w, "host: not probed")
		return
	}
	fmt.Fprintf(w, "host (probed %.0f ms before the rows, one thread spinning on the clock, %d reads): a busy thread lost >10 µs %.0f×/s, >20 µs %.0f×/s, >40 µs %.0f×/s, >100 µs %.0f×/s; longest %.0f µs\n",
		float64(h.HostProbeMs), h.HostReads, float64(h.HostOver10PerS), float64(h.HostOver20PerS),
		float64(h.HostOver40PerS), float64(h.HostOver100PerS), float64(h.HostMaxGapUs))
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s/%s ", r.Scope, r.Policy)
		if math.IsNaN(float64(r.HostDelayP99Us)) {
			b.WriteString("-")
			continue
		}
		fmt.Fprintf(&b, "%.1f µs: %.1f/%.1f (%.1f%%)", float64(r.HostWindowUs), float64(r.HostDelayP50Us),
			float64(r.HostDelayP99Us), 100*float64(r.HostDelayOver20))
	}
	fmt.Fprintf(w, "host delay to W µs of work (W = the row's crit p50) started at a random moment, p50/p99 µs (share delayed >20 µs): %s\n", b.String())
}

// untouchedVerdict is target (a)'s verdict: n/a when every QP writes MR 0.
func untouchedVerdict(r Ratio) string {
	switch {
	case math.IsNaN(float64(r)):
		return "n/a, no QP leaves MR 0 untouched"
	case float64(r) >= TargetUntouchedRatio:
		return "met"
	}
	return "NOT met"
}

func ratio(r Ratio) string {
	if math.IsNaN(float64(r)) {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(r))
}

func size(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// WriteJSON writes the results as an indented JSON array.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rs)
}

// WriteCSV writes the results as CSV, a header line of the JSON field
// names then one line per result; NaN ratios are empty fields.
func WriteCSV(w io.Writer, rs []Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	for _, r := range rs {
		// Through JSON, so that the columns are the JSON fields in
		// order and stay in step with them.
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		rec := make([]string, len(csvHeader))
		for i, k := range csvHeader {
			v := string(m[k])
			if v == "null" {
				v = ""
			} else if s, err := strconv.Unquote(v); err == nil {
				v = s
			}
			rec[i] = v
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// csvHeader is Result's JSON field names in declaration order.
var csvHeader = func() []string {
	b, _ := json.Marshal(Result{})
	// Decode keeping the order.
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var keys []string
	_, _ = dec.Token() // {
	for dec.More() {
		t, _ := dec.Token()
		keys = append(keys, t.(string))
		var v json.RawMessage
		_ = dec.Decode(&v)
	}
	return keys
}()

// Plot draws the results into path (.svg, .png or .pdf, by extension):
// three panels by scope (the control runs are left out), one bar per policy — the untouched QPs'
// throughput ratio with the 0.95 target, the critical section p50 and p99
// against the dirty-page copy plus 20 µs, and the QPs paused per remap.
func Plot(path string, all []Result, title string) error {
	var scopes, policies []string
	var rs []Result
	for _, r := range all {
		if _, err := softrdma.ParseScope(r.Scope); err == nil {
			rs = append(rs, r)
		}
	}
	for _, r := range rs {
		if !slices.Contains(scopes, r.Scope) {
			scopes = append(scopes, r.Scope)
		}
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
	}
	get := func(f func(Result) float64) map[string]plotter.Values {
		m := map[string]plotter.Values{}
		for _, p := range policies {
			v := make(plotter.Values, len(scopes))
			for i := range v {
				v[i] = math.NaN()
			}
			m[p] = v
		}
		for _, r := range rs {
			x := f(r)
			if math.IsNaN(x) {
				x = 0
			}
			m[r.Policy][slices.Index(scopes, r.Scope)] = x
		}
		return m
	}
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}}
	const bw = 14
	bars := func(p *plot.Plot, series []string, vals map[string]plotter.Values, colorOf func(int) color.Color) error {
		for k, name := range series {
			b, err := plotter.NewBarChart(vals[name], vg.Points(bw))
			if err != nil {
				return err
			}
			b.Color = colorOf(k)
			b.LineStyle.Width = 0
			b.Offset = vg.Points(bw * (float64(k) - float64(len(series)-1)/2))
			p.Add(b)
			p.Legend.Add(name, b)
		}
		p.NominalX(scopes...)
		p.Legend.Top = true
		return nil
	}
	hline := func(p *plot.Plot, y float64, label string) {
		l := plotter.NewFunction(func(float64) float64 { return y })
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 0x40}
		l.Width = vg.Points(1)
		p.Add(l)
		p.Legend.Add(label, l)
	}

	thr := plot.New()
	thr.Title.Text = "QPs not writing the remapped MR"
	thr.Y.Label.Text = "throughput / no-remap baseline"
	thr.X.Label.Text = "scope"
	if err := bars(thr, policies, get(func(r Result) float64 { return float64(r.Untouched) }), func(k int) color.Color { return colors[k%4] }); err != nil {
		return err
	}
	hline(thr, TargetUntouchedRatio, "target 0.95")
	thr.Y.Min = 0
	thr.Y.Max = 1.3 // room for the legend above 1.0
	for _, r := range rs {
		if x := float64(r.Untouched); !math.IsNaN(x) {
			thr.Y.Max = max(thr.Y.Max, 1.3*x)
		}
	}

	crit := plot.New()
	crit.Title.Text = "critical section per remap"
	crit.Y.Label.Text = "µs"
	crit.X.Label.Text = "scope"
	var series []string
	vals := map[string]plotter.Values{}
	for _, p := range policies {
		v50 := get(func(r Result) float64 { return r.CriticalP50Us })[p]
		v99 := get(func(r Result) float64 { return r.CriticalP99Us })[p]
		lim := get(func(r Result) float64 { return r.DirtyCopyP50 + TargetOverheadUs })[p]
		series = append(series, p+" p50", p+" p99", p+" copy+20")
		vals[p+" p50"], vals[p+" p99"], vals[p+" copy+20"] = v50, v99, lim
	}
	shade := func(k int) color.Color {
		c := colors[(k/3)%4].(color.RGBA)
		switch k % 3 {
		case 1: // p99: lighter
			c = color.RGBA{R: uint8((int(c.R) + 255) / 2), G: uint8((int(c.G) + 255) / 2), B: uint8((int(c.B) + 255) / 2), A: 0xff}
		case 2: // the target
			c = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
		}
		return c
	}
	if err := bars(crit, series, vals, shade); err != nil {
		return err
	}
	// Log scale: the p99 is tens of times the p50. Room above for the
	// legend.
	crit.Y.Scale = floorLog{}
	crit.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	crit.Y.Min, crit.Y.Max = math.Inf(1), 0
	for _, v := range vals {
		for _, x := range v {
			if x > 0 {
				crit.Y.Min, crit.Y.Max = min(crit.Y.Min, x), max(crit.Y.Max, x)
			}
		}
	}
	crit.Y.Min, crit.Y.Max = crit.Y.Min/2, crit.Y.Max*30
	crit.Y.Label.Text = "µs (log)"

	qps := plot.New()
	qps.Title.Text = "QPs paused per remap (mean)"
	qps.Y.Label.Text = "QPs"
	qps.X.Label.Text = "scope"
	if err := bars(qps, policies, get(func(r Result) float64 { return r.QPsPausedMean }), func(k int) color.Color { return colors[k%4] }); err != nil {
		return err
	}
	qps.Y.Min = 0
	qps.Y.Max = 1
	for _, r := range rs {
		qps.Y.Max = max(qps.Y.Max, 1.4*r.QPsPausedMean)
	}

	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	c, err := draw.NewFormattedCanvas(vg.Points(1200), vg.Points(420), format)
	if err != nil {
		return fmt.Errorf("scopes: plot %s: %w", path, err)
	}
	dc := draw.New(c)
	if title != "" {
		dc.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 13), Handler: plot.DefaultTextHandler,
			XAlign: draw.XCenter, YAlign: draw.YTop}, vg.Point{X: dc.Center().X, Y: dc.Max.Y - vg.Points(4)}, title)
	}
	tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Points(24), PadTop: vg.Points(30), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	plots := [][]*plot.Plot{{thr, crit, qps}}
	canvases := plot.Align(plots, tiles, dc)
	for i, p := range plots[0] {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("scopes: plot: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("scopes: plot %s: %w", path, err)
	}
	return f.Close()
}

// floorLog is a log scale on which values at or below the axis minimum
// (the bars' base, 0) sit at the bottom instead of panicking.
type floorLog struct{}

func (floorLog) Normalize(lo, hi, x float64) float64 {
	return plot.LogScale{}.Normalize(lo, hi, max(x, lo))
}
