// Package results is the model of the results files that replay writes and
// reads: replay sim, replay gpu, replay fit, a sweep's and a merge's
// results. A file is a JSON object
//
//	{"kind": "sim", "version": 2, "results": [...]}
//
// whose kind says what its records are: "sim" (Result, also for replay
// gpu --sim-only, sweep and merge), "gpu" (GPU), "fit" (Fit) or "diff"
// (Diff). A file of kind "sim" of replay sim over the ranks of a
// multi-GPU job has a "jobs" list after its results (Job; its ranks'
// results have their "rank"): an addition of version 2 that readers of
// version 2 without it skip, and that files without it lack. A Reader
// reads a file's records one at a time and also reads the files written
// before files said their kind, telling each record apart by its keys.
//
// The package imports sim for Result and nothing that imports it (not
// gpu, nor the trace importers), so that plots and reports can read results
// anywhere.
package results

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Kind says what the records of a results file are. The zero value is
// invalid: it stands for a file written before files said their kind.
type Kind int

const (
	// KindSim records are Result: replay sim, replay gpu --sim-only,
	// a sweep's and a merge's results.
	KindSim Kind = iota + 1
	// KindGPU records are GPU: replay gpu on a real device.
	KindGPU
	// KindFit records are Fit: replay fit.
	KindFit
	// KindDiff records are Diff: replay diff.
	KindDiff
	// KindTune records are Tune: replay tune's candidates, ranked.
	KindTune
)

var kindNames = [...]string{"", "sim", "gpu", "fit", "diff", "tune"}

// String returns the kind as a file says it ("sim", "gpu", "fit"), or
// "Kind(N)" for an invalid one.
func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// ParseKind returns the kind a file names; false for an unknown name.
func ParseKind(s string) (Kind, bool) {
	for k, n := range kindNames {
		if k > 0 && n == s {
			return Kind(k), true
		}
	}
	return 0, false
}

// Version is the version of the results files written. A Reader reads
// files of this version, of version 1 and those without one (written
// before files said their kind and version). Version 2 defines
// fragmentation as the free reserved memory that could not serve a request
// (Result.PeakFragmentation); before, "fragmentation" was the idle
// share 1 - allocated/reserved, now Result.IdleAtPeak and Point.Idle,
// to which a Reader moves the older files' figures (upgradeV1).
const Version = 2

// upgradeV1 moves the fragmentation figures of a result of a file of
// version 1 or none, then 1 - allocated/reserved, to the idle share, and
// says in its warnings that its fragmentation is unknown.
func upgradeV1(r *Result) {
	r.IdleAtPeak, r.FragmentationAtPeak, r.PeakFragmentation = r.FragmentationAtPeak, 0, 0
	r.FragmentationUnknown = true
	for k := range r.Series {
		r.Series[k].Idle, r.Series[k].Fragmentation = r.Series[k].Fragmentation, 0
	}
	r.Warnings = append(r.Warnings, "from a results file of version 1: its fragmentation figures (1 - allocated/reserved) are shown as the idle share; its fragmentation as defined now is unknown (replay the trace again)")
}

// The errors a Reader returns, wrapped in an *Error.
var (
	ErrNoResults          = errors.New(`no "results" list: not the JSON of replay sim, gpu, fit, sweep or merge`)
	ErrUnknownKind        = errors.New("unknown kind of results")
	ErrUnsupportedVersion = errors.New("unsupported results version")
	ErrNoTraceOrPolicy    = errors.New("no trace or policy: not a result of replay sim, gpu, fit or sweep")
	ErrNoJobOrPolicy      = errors.New("no job or policy: not a job of replay sim")
	// ErrAfterResults is a file's "kind" or "version" after its "results"
	// list (every writer puts them first), and ErrTrailingData anything
	// after the file's object, such as a second file appended to it.
	ErrAfterResults = errors.New(`"kind" and "version" must come before the "results" list`)
	ErrTrailingData = errors.New("data after the end of the results file")
	// ErrNotResults is a file that is not JSON from its first byte: a
	// trace given where results are wanted, most often.
	ErrNotResults = errors.New("not a results file (the JSON replay sim, gpu, fit or sweep write); a trace? replay sim --json FILE TRACE writes its results")
)

// Error is an error reading a results file: the file's name, the index of
// the result in its "results" list (-1 for the file's own keys) and the
// byte offset where reading stopped.
type Error struct {
	File   string
	Result int
	Offset int64
	Err    error
}

func (e *Error) Error() string {
	if e.Result < 0 {
		return fmt.Sprintf("%s: byte offset %d: %v", e.File, e.Offset, e.Err)
	}
	return fmt.Sprintf("%s: result %d, byte offset %d: %v", e.File, e.Result, e.Offset, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// WriteSim writes sim results as a results file of kind "sim", indented
// by one space.
func WriteSim(w io.Writer, rs []*Result) error { return write(w, KindSim, rs, nil) }

// WriteSimJobs writes sim results and the jobs of their ranks as a results
// file of kind "sim", the jobs under "jobs" after the results; without
// jobs it writes what WriteSim does.
func WriteSimJobs(w io.Writer, rs []*Result, jobs []*Job) error {
	return write(w, KindSim, rs, jobs)
}

// WriteGPU writes replay gpu results as a results file of kind "gpu".
func WriteGPU(w io.Writer, rs []*GPU) error { return write(w, KindGPU, rs, nil) }

// WriteTune writes replay tune's candidates as a results file of kind
// "tune".
func WriteTune(w io.Writer, ts []*Tune) error { return write(w, KindTune, ts, nil) }

// WriteFit writes replay fit answers as a results file of kind "fit".
func WriteFit(w io.Writer, rs []*Fit) error { return write(w, KindFit, rs, nil) }

// WriteJSON writes v as JSON indented by one space and a newline, as
// results files, a sweep's plan.json and replay stats --json are written.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(v)
}

func write[T any](w io.Writer, kind Kind, rs []T, jobs []*Job) error {
	if rs == nil {
		rs = []T{}
	}
	return WriteJSON(w, struct {
		Kind    string `json:"kind"`
		Version int    `json:"version"`
		Results []T    `json:"results"`
		Jobs    []*Job `json:"jobs,omitempty"`
	}{kind.String(), Version, rs, jobs})
}

// Record is one result of a results file: Sim, GPU or Fit, as Kind says;
// Index is its position in the file's "results" list, from 0.
type Record struct {
	Kind  Kind
	Index int
	Sim   *Result
	GPU   *GPU
	Fit   *Fit
	Diff  *Diff
	Tune  *Tune
}

// Reader reads the records of a results file one at a time, in the manner
// of bufio.Scanner:
//
//	r, err := results.Open(path)
//	...
//	for r.Scan() {
//		rec := r.Record()
//	}
//	err = r.Err()
type Reader struct {
	name    string
	dec     *json.Decoder
	closer  io.Closer
	kind    Kind
	version int
	rec     Record
	n       int
	jobs    []*Job
	err     error
	done    bool
}

// NewReader reads the keys of the results file in r up to its "results"
// list; name names the file in errors. A file written before files said
// their kind has Kind 0, and the kind of each of its records is told by
// its keys (a "min_capacity_bytes" key for a fit answer, a "runtime" key
// for a replay gpu result, else a sim result), as reports did. Errors are
// *Error, wrapping a JSON error, ErrNotResults, ErrNoResults,
// ErrUnknownKind or ErrUnsupportedVersion.
func NewReader(r io.Reader, name string) (*Reader, error) {
	rd := &Reader{name: name, dec: json.NewDecoder(r)}
	if err := rd.header(); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		var syn *json.SyntaxError
		if errors.As(err, &syn) && syn.Offset <= 1 {
			err = ErrNotResults
		}
		return nil, &Error{File: name, Result: -1, Offset: rd.dec.InputOffset(), Err: err}
	}
	return rd, nil
}

// Open opens the results file at path, or for a directory (a sweep's or a
// merge's) its results.json, and reads its keys as NewReader does. Errors
// name the file. Close the Reader when done.
func Open(path string) (*Reader, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "results.json")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := NewReader(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	r.closer = f
	return r, nil
}

// Close closes the file Open opened; for a Reader of NewReader it does
// nothing.
func (r *Reader) Close() error {
	if r.closer == nil {
		return nil
	}
	return r.closer.Close()
}

// Name returns the file's name, as given.
func (r *Reader) Name() string { return r.name }

// Kind returns the kind the file says, 0 for a file that says none.
func (r *Reader) Kind() Kind { return r.kind }

// Version returns the file's version, 0 for a file that says none.
func (r *Reader) Version() int { return r.version }

// Jobs returns the jobs the file lists under "jobs" (see Job), nil for a
// file without them. A writer puts them after the results: they are all
// read once Scan has returned false without an error.
func (r *Reader) Jobs() []*Job { return r.jobs }

// readJobs reads a "jobs" list; each job must name its job and policy.
// Its errors are jobsError.
func (r *Reader) readJobs() error {
	var jobs []*Job
	if err := r.dec.Decode(&jobs); err != nil {
		return jobsError{err}
	}
	for k, j := range jobs {
		if j == nil || j.Job == "" || j.Policy == "" {
			return jobsError{fmt.Errorf("job %d: %w", k, ErrNoJobOrPolicy)}
		}
	}
	r.jobs = append(r.jobs, jobs...)
	return nil
}

// jobsError is an error in a file's "jobs" list, which is none of its
// results'.
type jobsError struct{ err error }

func (e jobsError) Error() string { return "jobs: " + e.err.Error() }
func (e jobsError) Unwrap() error { return e.err }

func (r *Reader) header() error {
	tok, err := r.dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return ErrNoResults
	}
	var kindName string
	for r.dec.More() {
		tok, err := r.dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case "kind":
			if err := r.dec.Decode(&kindName); err != nil {
				return fmt.Errorf("kind: %w", err)
			}
			k, ok := ParseKind(kindName)
			if !ok {
				return fmt.Errorf("%w %q (known: sim, gpu, fit, diff, tune)", ErrUnknownKind, kindName)
			}
			r.kind = k
		case "version":
			if err := r.dec.Decode(&r.version); err != nil {
				return fmt.Errorf("version: %w", err)
			}
			if r.version < 0 || r.version > Version {
				return fmt.Errorf("%w %d (this replay reads up to %d)", ErrUnsupportedVersion, r.version, Version)
			}
		case "results":
			tok, err := r.dec.Token()
			if err != nil {
				return err
			}
			if tok != json.Delim('[') {
				return ErrNoResults
			}
			return nil
		case "jobs":
			if err := r.readJobs(); err != nil {
				return err
			}
		default:
			var skip json.RawMessage
			if err := r.dec.Decode(&skip); err != nil {
				return err
			}
		}
	}
	return ErrNoResults
}

// Scan reads the next record, which Record then returns. It returns false
// at the end of the list or at an error, which Err returns.
func (r *Reader) Scan() bool {
	if r.done {
		return false
	}
	if !r.dec.More() {
		r.done = true
		if _, err := r.dec.Token(); err != nil { // the list's ']'
			r.fail(err)
		} else if err := r.trailer(); err != nil {
			r.fail(err)
		}
		return false
	}
	var raw json.RawMessage
	if err := r.dec.Decode(&raw); err != nil {
		r.fail(err)
		return false
	}
	rec, err := decodeRecord(raw, r.kind)
	if err != nil {
		r.fail(err)
		return false
	}
	if r.version < 2 {
		for _, res := range rec.results() {
			upgradeV1(res)
		}
		if rec.Diff != nil {
			rec.Diff.Figures = NewDiff(&rec.Diff.A, &rec.Diff.B).Figures
		}
	}
	rec.Index = r.n
	r.rec = rec
	r.n++
	return true
}

// trailer reads what follows the "results" list to the end of the
// input: keys other than kind and version are skipped; the object must
// end, and nothing but space follow it.
func (r *Reader) trailer() error {
	for r.dec.More() {
		tok, err := r.dec.Token()
		if err != nil {
			return err
		}
		if tok == "kind" || tok == "version" {
			return ErrAfterResults
		}
		if tok == "jobs" {
			if err := r.readJobs(); err != nil {
				return err
			}
			continue
		}
		var skip json.RawMessage
		if err := r.dec.Decode(&skip); err != nil {
			return err
		}
	}
	if _, err := r.dec.Token(); err != nil { // the object's '}'
		return err
	}
	if _, err := r.dec.Token(); err != io.EOF {
		if err == nil {
			err = ErrTrailingData
		}
		return err
	}
	return nil
}

func (r *Reader) fail(err error) {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF // the file ends inside its list
	}
	r.done = true
	result := r.n
	if errors.As(err, new(jobsError)) {
		result = -1 // the file's own key
	}
	r.err = &Error{File: r.name, Result: result, Offset: r.dec.InputOffset(), Err: err}
}

// Record returns the record Scan read; valid until the next Scan.
func (r *Reader) Record() Record { return r.rec }

// Err returns the error that stopped Scan, nil at the end of the list.
func (r *Reader) Err() error { return r.err }

func decodeRecord(raw json.RawMessage, kind Kind) (Record, error) {
	if kind == 0 {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			return Record{}, err
		}
		kind = KindSim
		if _, ok := keys["min_capacity_bytes"]; ok {
			kind = KindFit
		} else if _, ok := keys["runtime"]; ok {
			kind = KindGPU
		}
	}
	rec := Record{Kind: kind}
	switch kind {
	case KindFit:
		rec.Fit = &Fit{}
		return rec, json.Unmarshal(raw, rec.Fit)
	case KindDiff:
		rec.Diff = &Diff{}
		if err := json.Unmarshal(raw, rec.Diff); err != nil {
			return rec, err
		}
		if err := checkNamed(&rec.Diff.A); err != nil {
			return rec, err
		}
		return rec, checkNamed(&rec.Diff.B)
	case KindTune:
		rec.Tune = &Tune{}
		if err := json.Unmarshal(raw, rec.Tune); err != nil {
			return rec, err
		}
		return rec, checkNamed(&rec.Tune.Result)
	case KindGPU:
		rec.GPU = &GPU{}
		if err := json.Unmarshal(raw, rec.GPU); err != nil {
			return rec, err
		}
		return rec, checkNamed(&rec.GPU.Result)
	}
	rec.Sim = &Result{}
	if err := json.Unmarshal(raw, rec.Sim); err != nil {
		return rec, err
	}
	return rec, checkNamed(rec.Sim)
}

// results returns the sim results the record holds.
func (rec Record) results() []*Result {
	switch {
	case rec.Sim != nil:
		return []*Result{rec.Sim}
	case rec.GPU != nil:
		return []*Result{&rec.GPU.Result}
	case rec.Diff != nil:
		return []*Result{&rec.Diff.A, &rec.Diff.B}
	}
	return nil
}

func checkNamed(r *Result) error {
	if r.Trace == "" || r.Policy == "" {
		return ErrNoTraceOrPolicy
	}
	return nil
}

// ReadSim reads the sim results of the file at path (see Open). A record of
// another kind is an *Error that says so.
func ReadSim(path string) ([]*Result, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out []*Result
	for r.Scan() {
		rec := r.Record()
		if rec.Kind != KindSim {
			return nil, &Error{File: r.name, Result: rec.Index, Offset: r.dec.InputOffset(), Err: fmt.Errorf("a %s result, not a sim one", rec.Kind)}
		}
		out = append(out, rec.Sim)
	}
	return out, r.Err()
}
