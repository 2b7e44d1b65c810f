//go:build unix

package sweep

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes the sweep directory dir for this run: an exclusive flock
// on dir/.lock, which the system lets go when the process ends, however it
// ends. It returns the lock file, to close when the run is done, or an
// error when another sweep holds the directory now.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("sweep: %s is in use by another sweep running now (%s is locked): give each sweep its own directory, or run this one when the other has ended", dir, path)
		}
		return nil, fmt.Errorf("sweep: locking %s: %w", path, err)
	}
	return f, nil
}
