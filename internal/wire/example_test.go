package wire_test

import (
	"fmt"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

func Example() {
	data := wire.Encode(&broker.Envelope{ID: "m1", Receiver: "orders", Content: []byte("hi")})
	env, err := wire.Decode(data)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(env.ID, env.Receiver, string(env.Content))

	_, err = wire.Decode([]byte("garbage"))
	fmt.Println(err)
	// Output:
	// m1 orders hi
	// wire: malformed envelope: unknown version 103
}
