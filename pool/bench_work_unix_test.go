//go:build unix

package pool

import "syscall"

// osCount returns the process's voluntary context switches (a thread that
// went to sleep: a futex wait, a poll) and its CPU time in nanoseconds.
func osCount() (sleeps, cpuNanos int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1, -1
	}
	return int64(ru.Nvcsw), syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime)
}
