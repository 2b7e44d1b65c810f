package replaycli

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// exitError is an error whose command exits with its own status.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// ExitCode returns the status to exit with.
func (e *exitError) ExitCode() int { return e.code }

// interruptible returns a context cancelled at SIGINT or SIGTERM, the
// function that stops listening, and the function that makes the error of
// a command stopped by it: msg, exiting 128 + the signal's number (130,
// 143), as a shell reports a command killed by the signal.
func interruptible() (context.Context, func(), func(msg string) error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	var mu sync.Mutex
	var got os.Signal
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-c:
			mu.Lock()
			got = sig
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			signal.Stop(c)
			close(done)
			cancel()
		})
	}
	fail := func(msg string) error {
		mu.Lock()
		defer mu.Unlock()
		code := 130 // no signal seen: as SIGINT
		if got != nil {
			code = atomicfile.SignalStatus(got)
		}
		return &exitError{code: code, msg: msg}
	}
	return ctx, stop, fail
}
