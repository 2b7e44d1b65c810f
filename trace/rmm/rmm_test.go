package rmm

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

func importAll(t testing.TB, data []byte) ([]trace.Event, error) {
	t.Helper()
	src, err := Import(bytes.NewReader(data), "log.csv")
	if err != nil {
		return nil, err
	}
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

// TestMidnight imports a log that crosses midnight and has a failed
// allocation: times keep growing past 24 h, the failure has no address.
func TestMidnight(t *testing.T) {
	data, err := os.ReadFile("testdata/midnight.csv")
	if err != nil {
		t.Fatal(err)
	}
	if !Detect(data) {
		t.Fatal("Detect: false")
	}
	evs, err := importAll(t, data)
	if err != nil {
		t.Fatal(err)
	}
	const d = 86400_000_000_000
	want := []trace.Event{
		{Op: trace.OpMalloc, Time: d - 2_000_000, Addr: 0x7f8418000000, Size: 4000, Thread: 140202007955264},
		{Op: trace.OpMalloc, Time: d - 500_000, Addr: 0x7f8418000fa0, Size: 1048576, Stream: 0x55d0c6a4e2b0, Thread: 140202007955264},
		{Op: trace.OpMallocFailed, Time: d - 100_000, Size: 100000000000, Thread: 140202007955265},
		{Op: trace.OpFree, Time: d + 100_000, Addr: 0x7f8418000000, Size: 4000, Thread: 140202007955264},
		{Op: trace.OpMalloc, Time: d + 250_000, Addr: 0x7f8418000000, Size: 256, Stream: 0x55d0c6a4e2b0, Thread: 140202007955265},
		{Op: trace.OpFree, Time: d + 1_500_000_000, Addr: 0x7f8418000fa0, Size: 1048576, Stream: 0x55d0c6a4e2b0, Thread: 140202007955265},
		{Op: trace.OpFree, Time: d + 1_500_001_000, Addr: 0x7f8418000000, Size: 256, Stream: 0x55d0c6a4e2b0, Thread: 140202007955264},
	}
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d", len(evs), len(want))
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Errorf("event %d: %s\nwant      %s", i, trace.FormatText(evs[i]), trace.FormatText(want[i]))
		}
	}
	problems, err := trace.Validate(trace.NewSliceSource(trace.Header{}, evs), 0)
	if err != nil || len(problems) != 0 {
		t.Errorf("validate: %v %v", err, problems)
	}
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      trace.Event
	}{
		{"reordered columns and extra", "Action,Size,Pointer,Stream,Thread,Time,Extra\nallocate,10,0x10,0x1,7,00:00:01.5,x\n",
			trace.Event{Op: trace.OpMalloc, Size: 10, Addr: 0x10, Stream: 1, Thread: 7, Time: 1_500_000_000}},
		{"epoch seconds, deallocate", "Thread,Time,Action,Pointer,Size,Stream\n1,1634567890.123456,deallocate,7f00,8,0\n",
			trace.Event{Op: trace.OpFree, Size: 8, Addr: 0x7f00, Thread: 1, Time: 1634567890_123456000}},
		{"BOM, CRLF, hex thread", "\xef\xbb\xbfThread,Time,Action,Pointer,Size,Stream\r\n0x1f,01:02:03.000001,allocate failure,(nil),99,(nil)\r\n",
			trace.Event{Op: trace.OpMallocFailed, Size: 99, Thread: 31, Time: 3723_000_001_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := importAll(t, []byte(tc.log))
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 1 || evs[0] != tc.want {
				t.Errorf("got %v, want %s", evs, trace.FormatText(tc.want))
			}
		})
	}
}

func TestErrors(t *testing.T) {
	const head = Header + "\n"
	for _, tc := range []struct {
		name, log, want string
	}{
		{"empty", "", "log.csv: not an RMM log"},
		{"no stream column", "Thread,Time,Action,Pointer,Size\n", "line 1 has no Stream column"},
		{"bad action", head + "1,00:00:00.1,alloc,0x1,1,0x0\n", `log.csv:2: unknown action "alloc"`},
		{"bad time", head + "1,25:00:00.1,allocate,0x1,1,0x0\n", `log.csv:2: Time "25:00:00.1"`},
		{"bad size", head + "1,00:00:00.1,allocate,0x1,-4,0x0\n", `log.csv:2: Size "-4"`},
		{"bad pointer", head + "1,00:00:00.1,allocate,0xzz,4,0x0\n", `log.csv:2: Pointer "0xzz": not a hex number`},
		{"short row", head + "1,00:00:00.1,allocate\n", "log.csv:2: 3 fields, want 6"},
		{"bad quote", head + "1,00:00:00.1,\"allocate,0x1,4,0x0\n", "log.csv:2:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := importAll(t, []byte(tc.log))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			var se *trace.SyntaxError
			if strings.Contains(tc.want, ":2") && !errors.As(err, &se) {
				t.Errorf("%T is not a *trace.SyntaxError", err)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	for in, want := range map[string]bool{
		Header + "\n":                      true,
		"\xef\xbb\xbf" + Header:            true,
		"Thread,Action,Time,Pointer":       true,
		"malloc id=1 size=4096 stream=0\n": false,
		"GPUTRACE":                         false,
		"":                                 false,
	} {
		if Detect([]byte(in)) != want {
			t.Errorf("Detect(%q) = %v", in, !want)
		}
	}
}

// FuzzImport only demands that Import never panics and that an error is
// final.
func FuzzImport(f *testing.F) {
	data, _ := os.ReadFile("testdata/midnight.csv")
	f.Add(data)
	f.Add([]byte(Header + "\n1,00:00:00.1,allocate,0x1,1,0x0\n"))
	oneLine := func(t *testing.T, err error) {
		if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "fuzz.csv") {
			t.Fatalf("error %q: not one line naming the file", msg)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		src, err := Import(bytes.NewReader(b), "fuzz.csv")
		if err != nil {
			oneLine(t, err)
			return
		}
		for i := 0; i < 1<<16; i++ {
			if _, err := src.Next(); err != nil {
				if _, err2 := src.Next(); err2 != err {
					t.Fatalf("error not final: %v then %v", err, err2)
				}
				if err != io.EOF {
					oneLine(t, err)
				}
				return
			}
		}
	})
}
