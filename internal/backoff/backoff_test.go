package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		base, max time.Duration
		n         int
		want      time.Duration // before jitter
	}{
		{100 * time.Millisecond, 30 * time.Second, 0, 100 * time.Millisecond},
		{100 * time.Millisecond, 30 * time.Second, 3, 800 * time.Millisecond},
		{100 * time.Millisecond, 30 * time.Second, 9, 30 * time.Second},
		{100 * time.Millisecond, 30 * time.Second, 1 << 30, 30 * time.Second},
		{50 * time.Millisecond, 5 * time.Second, 62, 5 * time.Second},
		{time.Second, 100 * time.Millisecond, 0, 100 * time.Millisecond},
		{0, time.Second, 1 << 30, 0},
		{1, time.Second, 0, 1},
	}
	for _, tc := range tests {
		for range 100 {
			got := Delay(tc.base, tc.max, tc.n)
			lo := tc.want / 2
			if tc.want <= 1 {
				lo = tc.want
			}
			if got < lo || got > tc.want {
				t.Fatalf("Delay(%v, %v, %d) = %v, want within [%v, %v]", tc.base, tc.max, tc.n, got, lo, tc.want)
			}
		}
	}
}
