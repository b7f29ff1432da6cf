//go:build !unix

package pool

// osCount reports that the OS gives no counts here.
func osCount() (sleeps, cpuNanos int64) { return -1, -1 }
