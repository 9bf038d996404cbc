package budget_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/bulwark-pds/bulwark/budget"
)

// A handler reserves what the work will hold before starting it, and maps
// a full queue to 503.
func ExampleGuard() {
	b := budget.New(budget.Config{Capacity: 64 << 20, MaxQueue: 128})

	serve := func(ctx context.Context, estimate int64) error {
		release, err := budget.Guard(ctx, b, estimate)
		if err != nil {
			return err
		}
		defer release()
		// ... export the CAR, send the blob ...
		return nil
	}

	err := serve(context.Background(), 4<<20)
	var overloaded *budget.OverloadedError
	switch {
	case err == nil:
		fmt.Println("served")
	case errors.As(err, &overloaded):
		fmt.Println("503, Retry-After", overloaded.RetryAfter)
	}
	fmt.Println("in use after:", b.Stats().InUse)
	// Output:
	// served
	// in use after: 0
}
