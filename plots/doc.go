// Package plots draws the results of replaying one trace against several
// allocator policies (results.Result values) as charts for design reviews:
// memory over the trace, fragmentation over the trace, peak memory per
// policy against the lower bound, and device calls per policy.
//
// Each chart has a builder that returns a *plot.Plot (Memory,
// Fragmentation, Peaks, Calls; LatencyCDF, Overview of every policy on
// every trace, Fit of the smallest capacities), so that callers may
// restyle it or render it elsewhere; Render writes a plot as PNG or SVG at
// slide size, and WriteAll groups results by trace and writes every chart
// of every trace, each file atomically. A Report puts the tables of a
// design review and its charts on one self-contained HTML page
// (WriteReport): the series are embedded as data (SeriesData, LatencyData)
// and drawn in the browser by uPlot (vendored under assets/uplot), with
// the values under the cursor and zoom; the bar charts become bars in the
// tables. Report.Charts builds the same figures as PNG and SVG for slides.
//
// Byte figures are drawn in MiB or GiB, chosen from the largest value drawn
// (ChooseUnit). A policy has one look in every chart, by its name: a
// colour-blind-safe colour and a line pattern (a bar hatch), all in
// style.go. The memory and fragmentation charts draw a readable set of
// policies (ShownPolicies); MemoryGrid draws every policy in small
// multiples.
package plots
