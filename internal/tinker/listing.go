package tinker

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Checkpoint is one entry of a CheckpointsListResponse (§3.14).
type Checkpoint struct {
	CheckpointID   string     `json:"checkpoint_id"`   // e.g. "sampler_weights/step-100"
	CheckpointType string     `json:"checkpoint_type"` // "training" or "sampler"
	Time           time.Time  `json:"time"`
	TinkerPath     string     `json:"tinker_path"`
	SizeBytes      *int64     `json:"size_bytes"`
	Public         bool       `json:"public"`
	ExpiresAt      *time.Time `json:"expires_at"`
}

// TrainingRun is one entry of a TrainingRunsResponse (§3.14).
type TrainingRun struct {
	TrainingRunID         string            `json:"training_run_id"`
	BaseModel             string            `json:"base_model"`
	ModelOwner            string            `json:"model_owner"`
	IsLora                bool              `json:"is_lora"`
	Corrupted             bool              `json:"corrupted"`
	LoraRank              *int              `json:"lora_rank"`
	LastRequestTime       time.Time         `json:"last_request_time"`
	LastCheckpoint        *Checkpoint       `json:"last_checkpoint"`
	LastSamplerCheckpoint *Checkpoint       `json:"last_sampler_checkpoint"`
	UserMetadata          map[string]string `json:"user_metadata"`
}

// cursor is the offset/limit pagination of §3.14.
type cursor struct {
	Offset     int `json:"offset"`
	Limit      int `json:"limit"`
	TotalCount int `json:"total_count"`
}

// ListOptions tune the listings. Zero values take the SDK defaults.
type ListOptions struct {
	PageSize    int    // items per request: 100 for checkpoints, 20 for training runs
	AccessScope string // "owned" (default) or "accessible"; training runs only
	ProjectID   string // optional filter; training runs only
}

// Checkpoints lists all checkpoints of the user (GET checkpoints, §3.14), page by
// page as the caller iterates. Breaking out of the loop fetches no further
// pages. A failure is yielded once as the error and ends the sequence.
func (c *Client) Checkpoints(ctx context.Context, opts ListOptions) iter.Seq2[Checkpoint, error] {
	size := opts.PageSize
	if size <= 0 {
		size = 100
	}
	return paginate(ctx, c, "checkpoints", "api/v1/checkpoints", url.Values{}, size,
		func(p *struct {
			Checkpoints []Checkpoint `json:"checkpoints"`
			Cursor      *cursor      `json:"cursor"`
		}) ([]Checkpoint, *cursor) {
			return p.Checkpoints, p.Cursor
		})
}

// TrainingRuns lists training runs (GET training_runs, §3.14) page by page as the
// caller iterates; see Checkpoints.
func (c *Client) TrainingRuns(ctx context.Context, opts ListOptions) iter.Seq2[TrainingRun, error] {
	size := opts.PageSize
	if size <= 0 {
		size = 20
	}
	q := url.Values{}
	scope := opts.AccessScope
	if scope == "" {
		scope = "owned"
	}
	q.Set("access_scope", scope)
	if opts.ProjectID != "" {
		q.Set("project_id", opts.ProjectID)
	}
	return paginate(ctx, c, "training_runs", "api/v1/training_runs", q, size,
		func(p *struct {
			TrainingRuns []TrainingRun `json:"training_runs"`
			Cursor       *cursor       `json:"cursor"`
		}) ([]TrainingRun, *cursor) {
			return p.TrainingRuns, p.Cursor
		})
}

// RunCheckpoints lists the checkpoints of one training run (not paginated, §3.14).
func (c *Client) RunCheckpoints(ctx context.Context, runID string) ([]Checkpoint, error) {
	var out struct {
		Checkpoints []Checkpoint `json:"checkpoints"`
	}
	cl := &call{name: "training_runs/checkpoints", method: http.MethodGet,
		path: "api/v1/training_runs/" + url.PathEscape(runID) + "/checkpoints", maxRetries: c.t.HTTPMaxRetries}
	if err := c.restJSON(ctx, cl, &out); err != nil {
		return nil, fmt.Errorf("tinker: list checkpoints of run %s: %w", runID, err)
	}
	return out.Checkpoints, nil
}

// paginate pages with limit/offset until a page is short or empty, the cursor's
// total_count is reached, or the consumer stops.
func paginate[T any, P any](ctx context.Context, c *Client, name, path string, q url.Values, size int,
	items func(*P) ([]T, *cursor)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		q := maps.Clone(q)
		for offset := 0; ; {
			q.Set("limit", strconv.Itoa(size))
			q.Set("offset", strconv.Itoa(offset))
			cl := &call{name: name, method: http.MethodGet, path: path + "?" + q.Encode(), maxRetries: c.t.HTTPMaxRetries}
			var page P
			if err := c.restJSON(ctx, cl, &page); err != nil {
				yield(zero, fmt.Errorf("tinker: list %s at offset %d: %w", name, offset, err))
				return
			}
			list, cur := items(&page)
			for _, it := range list {
				if !yield(it, nil) {
					return
				}
			}
			offset += len(list)
			// Without a cursor, a page longer than the limit means the server ignores
			// pagination: stop rather than loop.
			if len(list) == 0 || len(list) < size || (cur == nil && len(list) > size) ||
				(cur != nil && cur.TotalCount > 0 && offset >= cur.TotalCount) {
				return
			}
		}
	}
}
