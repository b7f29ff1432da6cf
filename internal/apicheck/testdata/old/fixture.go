// Package fixture is the API before a change, for apicheck's tests.
package fixture

// Store is an interface that callers implement.
type Store interface {
	Get(key string) (string, error)
}

// Options configures Open.
type Options struct {
	Size int
}

// Open opens a store.
func Open(o Options) (Store, error) { return nil, nil }

// Close closes what Open opened.
func Close() {}
