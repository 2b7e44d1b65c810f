package tracefile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Glob expands trace arguments: a glob (with ** for any number of
// directories), a directory (every file in it, recursively, whose content
// is a trace), or a file. It returns the paths in the order of args (a
// glob's and a directory's sorted), without duplicates, and notes on what
// a directory walk skipped ("DIR: N files that are no traces skipped").
// Errors: a file that does not exist (the *fs.PathError of os.Stat), a bad
// pattern or a pattern that matches no file, naming the pattern.
func Glob(args []string) (paths, notes []string, err error) {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, a := range args {
		if !hasMeta(a) {
			st, err := os.Stat(a)
			if err != nil {
				return nil, nil, err
			}
			if !st.IsDir() {
				add(a)
				continue
			}
			found, skipped, err := tracesIn(a)
			if err != nil {
				return nil, nil, err
			}
			if skipped > 0 {
				notes = append(notes, fmt.Sprintf("%s: %d files that are no traces skipped", a, skipped))
			}
			for _, p := range found {
				add(p)
			}
			continue
		}
		matches, err := globFiles(a)
		if err != nil {
			return nil, nil, err
		}
		if len(matches) == 0 {
			return nil, nil, fmt.Errorf("%q: no file matches", a)
		}
		for _, m := range matches {
			add(m)
		}
	}
	return out, notes, nil
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// tracesIn returns the files under dir whose first bytes are a trace
// format's (Detect), sorted, and how many others it saw.
// Detected text is taken only from files named *.txt or *.trace, since
// any text file would pass.
func tracesIn(dir string) ([]string, int, error) {
	var found []string
	skipped := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		head := make([]byte, 512)
		n, _ := io.ReadFull(f, head)
		f.Close()
		switch format := Detect(head[:n]); {
		case format == "":
			skipped++
		case format == "text" && !strings.HasSuffix(p, ".txt") && !strings.HasSuffix(p, ".trace"):
			skipped++
		default:
			found = append(found, p)
		}
		return nil
	})
	sort.Strings(found)
	return found, skipped, err
}

// globFiles expands a glob pattern in which "**" as a whole path element
// matches any number of directories; other elements follow
// filepath.Match. Only regular files are returned, sorted.
func globFiles(pattern string) ([]string, error) {
	if !strings.Contains(pattern, "**") {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", pattern, err)
		}
		var files []string
		for _, p := range m {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				files = append(files, p)
			}
		}
		return files, nil
	}
	parts := strings.Split(filepath.ToSlash(pattern), "/")
	// The walk starts at the longest prefix without metacharacters.
	k := 0
	for k < len(parts) && !hasMeta(parts[k]) {
		k++
	}
	root := strings.Join(parts[:k], "/")
	switch {
	case root == "" && strings.HasPrefix(pattern, "/"):
		root = "/"
	case root == "":
		root = "."
	}
	rest := parts[k:]
	for _, p := range rest {
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("%q: %v", pattern, err)
		}
	}
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if matchParts(rest, strings.Split(filepath.ToSlash(rel), "/")) {
			out = append(out, p)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

func matchParts(pat, name []string) bool {
	if len(pat) == 0 {
		return len(name) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(name); i++ {
			if matchParts(pat[1:], name[i:]) {
				return true
			}
		}
		return false
	}
	if len(name) == 0 {
		return false
	}
	ok, _ := filepath.Match(pat[0], name[0])
	return ok && matchParts(pat[1:], name[1:])
}
