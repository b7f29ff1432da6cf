package disker_test

import (
	"context"
	"fmt"

	"github.com/diskerhq/disker"
)

// ListBatches lists the latest batches of completion receivers, the
// latest created first, with their states and counts.
func ExampleDisker_ListBatches() {
	ctx := context.Background()
	d := openExample("example-list-batches", disker.Config{})
	defer d.Close(ctx)
	first, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "report-done"}})
	_, _ = first.Send(ctx, disker.Message{Receiver: "report-part"})
	second, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "report-done"}})
	_, _ = second.Seal(ctx) // no child: it completes
	l, err := d.ListBatches(ctx, []string{"report-done"}, 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, b := range l.Batches {
		fmt.Println(b.ID == second.ID(), b.State, b.Children)
	}
	// Output:
	// true completed 0
	// false open 1
}
