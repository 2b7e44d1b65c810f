package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const statsTrace = `header source=text
malloc id=1 size=1000 t=0 thread=1
malloc id=2 size=4KiB stream=7 kind=async t=10 thread=2
malloc id=3 size=100 kind=pinned t=20 thread=1
stream_sync stream=7 t=30 thread=2
free id=1 t=1000 thread=1
malloc id=4 size=3000 t=1010 thread=1 label=cudaMalloc@prog+0x11a9
free id=2 stream=7 t=5010 thread=2
malloc_failed size=1TiB t=5030 thread=1
`

func writeTrace(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "t.txt")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestStats(t *testing.T) {
	path := writeTrace(t, statsTrace)
	out, _, err := runCmd(t, "stats", path)
	if err != nil {
		t.Fatal(err)
	}
	want := path + `: text trace, 8 events over 5.0 µs
ops:
  malloc         4
  free           2
  malloc_failed  1
  stream_sync    1
mallocs by kind: device 2, async 1, pinned 1
peak live requested device bytes: 6.9 KiB (7096) at event 5
peak live pinned: 100 B, managed: 0 B
live at the end: 2 allocations, 3.0 KiB
sizes (mallocs, requested bytes): 4, min 100 B, p50 <= 4.0 KiB, p90 <= 4.0 KiB, p99 <= 4.0 KiB, max 4.0 KiB
       [64 B,    128 B)  1  25.0% ##################################################
      [512 B,  1.0 KiB)  1  25.0% ##################################################
    [2.0 KiB,  4.0 KiB)  1  25.0% ##################################################
    [4.0 KiB,  8.0 KiB)  1  25.0% ##################################################
lifetimes (malloc to free): 2, min 1.0 µs, p50 <= 5.0 µs, p90 <= 5.0 µs, p99 <= 5.0 µs, max 5.0 µs
    [512 ns,  1.0 µs)  1  50.0% ##################################################
    [4.1 µs,  8.2 µs)  1  50.0% ##################################################
streams: 2
    0x0  5 events  3 mallocs  4.0 KiB
    0x7  3 events  1 mallocs  4.0 KiB
threads: 2
    1  5 events
    2  3 events
`
	if out != want {
		t.Errorf("stats:\n%s\nwant:\n%s", out, want)
	}
	out, _, err = runCmd(t, "stats", "--json", path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Traces []trace.Summary }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	d := doc.Traces[0]
	if len(doc.Traces) != 1 || d.Events != 8 || d.Ops["malloc"] != 4 || d.Mallocs["async"] != 1 || d.PeakLive != 7096 ||
		d.LiveAtEnd != 2 || d.Sizes.Buckets["2048"] != 1 || d.Lifetimes.Count != 2 || len(d.Streams) != 2 || d.Threads["2"] != 3 {
		t.Errorf("json: %+v", d)
	}
}

func TestCheck(t *testing.T) {
	ok := writeTrace(t, "malloc id=1 size=10\nfree id=1\n")
	out, _, err := runCmd(t, "check", ok)
	if err != nil || out != ok+": ok: 2 events, no problems, nothing live at the end\n" {
		t.Errorf("ok trace: %v, %q", err, out)
	}
	// A recorded program's trace ends with the job: what is live is leaked.
	bad := writeTrace(t, strings.Replace(statsTrace, "source=text", "source=record", 1)+"free id=1 t=6000\n")
	out, _, err = runCmd(t, "check", bad)
	want := bad + `: event 8: double free of 0x1: freed at event 4
` + bad + `: leak: 0x3, 100 bytes (pinned) on stream 0x0, malloc at event 2 (t=20 ns, thread 1)
` + bad + `: leak: 0x4, 3000 bytes (device) on stream 0x0, malloc at event 5 (t=1010 ns, thread 1), call site cudaMalloc@prog+0x11a9
` + bad + `: 9 events, 1 problem, 2 allocations (3.0 KiB) live at the end of the job: leaks
`
	if out != want {
		t.Errorf("check:\n%s\nwant:\n%s", out, want)
	}
	if err == nil || err.Error() != "check: "+bad+": 1 problem, 2 leaks" {
		t.Errorf("error %v", err)
	}
	out, _, _ = runCmd(t, "check", "--limit", "1", bad)
	if !strings.Contains(out, ": ... 1 more leaks\n") {
		t.Errorf("--limit 1:\n%s", out)
	}
	// A snapshot is taken while the job runs: what is live at its end is
	// listed, and is no fault (the weights of a model, say).
	live := writeTrace(t, statsTrace)
	out, _, err = runCmd(t, "check", live)
	want = live + `: live at the end: 0x3, 100 bytes (pinned) on stream 0x0, malloc at event 2 (t=20 ns, thread 1)
` + live + `: live at the end: 0x4, 3000 bytes (device) on stream 0x0, malloc at event 5 (t=1010 ns, thread 1), call site cudaMalloc@prog+0x11a9
` + live + `: 8 events, 0 problems, 2 allocations (3.0 KiB) live at the end (the trace was taken while the job ran)
`
	if err != nil || out != want {
		t.Errorf("snapshot-like trace: %v\n%s\nwant:\n%s", err, out, want)
	}
	// A recorded program killed by a signal did not end its job: what is
	// live is not leaked either.
	killed := writeTrace(t, strings.Replace(statsTrace, "source=text", "source=record meta.exit_status=137 meta.signal=killed", 1))
	out, _, err = runCmd(t, "check", killed)
	if want := killed + ": 8 events, 0 problems, 2 allocations (3.0 KiB) live at the end (a signal ended the program: killed)\n"; err != nil || !strings.HasSuffix(out, want) || strings.Contains(out, "leak") {
		t.Errorf("killed program: %v\n%s\nwant the last line:\n%s", err, out, want)
	}
	out, _, err = runCmd(t, "check", writeTrace(t, statsTrace+"free id=1 t=6000\n"))
	if err == nil || !strings.HasSuffix(err.Error(), ": 1 problem") || !strings.Contains(out, ": live at the end: 0x3") {
		t.Errorf("snapshot-like trace with a problem: %v\n%s", err, out)
	}
}

func TestStatsCheckErrors(t *testing.T) {
	notTrace := writeTrace(t, "hello, world\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats"}, "stats: no trace given"},
		{[]string{"check"}, "check: no trace given"},
		{[]string{"stats", notTrace}, notTrace + ": not a trace"},
		{[]string{"check", notTrace}, notTrace + ": not a trace"},
	} {
		_, _, err := runCmd(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestStatsCard: the card and the recorded calls a record run header
// carries are shown.
func TestStatsCard(t *testing.T) {
	path := writeTrace(t, `header source=record device="NVIDIA H200" device_memory=150754820096 meta.calls.cuMemMap=3 meta.calls.cudaMalloc=2 meta.failed.cudaMalloc=1
malloc id=1 size=1GiB t=0
`)
	out, _, err := runCmd(t, "stats", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"card: NVIDIA H200, 140.4 GiB (150754820096 bytes)\n",
		"recorded calls: cuMemMap 3, cudaMalloc 2 (1 failed)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestDump: a native trace dumped in the text form reads back as the same
// header and events.
func TestDump(t *testing.T) {
	dir := t.TempDir()
	native := filepath.Join(dir, "t.trace")
	h, evs, err := trace.ParseText("t.txt", strings.NewReader(statsTrace))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracefile.WriteSource(native, trace.NewSliceSource(h, evs)); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "dump", native)
	if err != nil {
		t.Fatal(err)
	}
	h2, evs2, err := trace.ParseText("dump", strings.NewReader(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !reflect.DeepEqual(evs2, evs) || h2.Source != h.Source {
		t.Errorf("dump reads back as\n%v\n%+v\nwant\n%v\n%+v", h2, evs2, h, evs)
	}
}

// TestStatsLogicalTime: a MiniMalloc problem's lower and upper are steps,
// and stats says so (it printed them as nanoseconds: "over 1.0 ms").
func TestStatsLogicalTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.csv")
	if err := os.WriteFile(path, []byte("id,lower,upper,size\n0,0,10,4096\n1,5,2000,512\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "stats", path)
	if err != nil || !strings.Contains(out, "4 events over 2000 steps") || !strings.Contains(out, "max 1995 steps") || strings.Contains(out, "µs") {
		t.Errorf("stats: %v\n%s", err, out)
	}
}
