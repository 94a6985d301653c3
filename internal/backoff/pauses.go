package backoff

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Pause is one account's backoff deadline as a reader outside the fleet sees it.
type Pause struct {
	// Account is the account's key (AccountKey), which does not reveal its API key.
	Account string
	// Reason is what extended the deadline last: "rate_limited" (a 429), "billing" (a 402 in
	// the billing window) or a paused queue state.
	Reason string
	// Left is how far the deadline lies ahead of the server's clock: negative once it has
	// passed, by as much.
	Left time.Duration
}

// Pauses reads the backoff of every account in bucket, for a reader that is not part of the
// fleet (submit saying why a batch makes no progress). It reads the account keys only, not
// the capacity reports stored beside them, and measures each deadline against the server's
// clock, as the workers do. A bucket that does not exist yet holds none.
func Pauses(ctx context.Context, js jetstream.JetStream, bucket string) ([]Pause, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("backoff: bind bucket %s: %w", bucket, err)
	}
	now := time.Now()
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("backoff: read bucket %s: %w", bucket, err)
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil && !bs.StreamInfo().TimeStamp.IsZero() {
		now = bs.StreamInfo().TimeStamp
	}
	// An account key is one token (hex); a capacity report's has dots (internal/share).
	w, err := kv.Watch(ctx, "*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("backoff: read bucket %s: %w", bucket, err)
	}
	defer w.Stop()
	var pauses []Pause
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("backoff: read bucket %s: %w", bucket, ctx.Err())
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, fmt.Errorf("backoff: read bucket %s: the watch ended", bucket)
			case e == nil: // every key has been delivered
				return pauses, nil
			}
			if r, ok := decode(e); ok {
				dl, why, _ := r.deadline(e.Created())
				pauses = append(pauses, Pause{Account: e.Key(), Reason: why, Left: time.Duration(dl - now.UnixNano())})
			}
		}
	}
}
