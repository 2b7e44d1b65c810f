package sweep

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ResolveShard returns shard i of n that a --shard value spec names (given:
// the flag was set): i/n as written ("" for 0 of 1), or, for auto, auto/N
// or no --shard inside a Slurm array task, the scheduler's
// (SchedulerShard), which auto reports. done, when not nil, is told
// the number of tasks auto/N gives (0 for plain auto) and returns the
// number of shards an earlier run of the array left (0 if none), or an
// error to refuse the shard with. Its errors name --shard.
func ResolveShard(spec string, given bool, done func(count int) (int, error)) (i, n int, auto bool, err error) {
	autoSpec, count, ok := autoShard(spec, given)
	if !ok {
		i, n, err = ParseShard(spec)
		if err != nil {
			return 0, 0, false, fmt.Errorf("--shard %w", err)
		}
		return i, n, false, nil
	}
	if count < 0 {
		return 0, 0, false, fmt.Errorf("--shard %q: want auto, auto/N (N > 0) or i/n", autoSpec)
	}
	left := 0
	if done != nil {
		if left, err = done(count); err != nil {
			return 0, 0, false, fmt.Errorf("--shard %s: %w", autoSpec, err)
		}
	}
	i, n, found, err := SchedulerShard(os.Getenv, count, left)
	switch {
	case err != nil:
		return 0, 0, false, fmt.Errorf("--shard auto: %w", err)
	case !found:
		return 0, 0, false, fmt.Errorf("--shard %s: neither SLURM_ARRAY_TASK_ID nor JOB_COMPLETION_INDEX is set (not a Slurm array task or a Kubernetes Indexed Job pod)", autoSpec)
	}
	return i, n, true, nil
}

// autoShard reports whether the shard comes from the scheduler: --shard
// auto or auto/N (N the number of tasks, for a Kubernetes Indexed Job), or
// no --shard inside a Slurm array task.
func autoShard(shard string, given bool) (spec string, count int, ok bool) {
	if !given {
		if os.Getenv("SLURM_ARRAY_TASK_ID") != "" {
			return "auto", 0, true
		}
		return "", 0, false
	}
	rest, isAuto := strings.CutPrefix(shard, "auto")
	if !isAuto {
		return "", 0, false
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(rest, "/")); err == nil && strings.HasPrefix(rest, "/") && n > 0 {
		return shard, n, true
	}
	if rest != "" {
		return shard, -1, true
	}
	return shard, 0, true
}
