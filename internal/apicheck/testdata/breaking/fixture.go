// Package fixture is the API after an incompatible change, for apicheck's
// tests: Open's signature changed, Close is gone, and Store has a new
// method.
package fixture

// Store is an interface that callers implement.
type Store interface {
	Get(key string) (string, error)
	Put(key, value string) error
}

// Options configures Open.
type Options struct {
	Size int
}

// Open opens a store.
func Open(name string, o Options) (Store, error) { return nil, nil }
