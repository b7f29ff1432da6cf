package keyslot

import "testing"

// TestOf checks Of against values from the Redis Cluster specification and
// CLUSTER KEYSLOT (the redistest and redisbroker tests compare it with a
// live cluster for many more keys).
func TestOf(t *testing.T) {
	for _, c := range []struct {
		key  string
		want uint16
	}{
		{"123456789", 12739}, // the specification's CRC16 check value 0x31C3
		{"somekey", 11058},
		{"foo{hash_tag}", 2515},
		{"{hash_tag}:other", 2515},
		{"", 0},
	} {
		if got := Of(c.key); got != c.want {
			t.Errorf("Of(%q) = %d, want %d", c.key, got, c.want)
		}
	}
	if Of("foo{}{hash_tag}") == Of("hash_tag") {
		t.Errorf("an empty first tag must hash the whole key")
	}
	if Of("a{b") == Of("b") {
		t.Errorf("a '{' without '}' must hash the whole key")
	}
}
