package cluster

import (
	"fmt"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// testKey is the Tinker API key the simulator accepts in these tests.
const testKey = fleettest.APIKey

// startSim serves a simulator over loopback HTTP and returns it with its base URL.
func startSim(t testing.TB, cfg tinkersim.Config) (*tinkersim.Server, string) {
	t.Helper()
	return fleettest.Sim(t, cfg)
}

// makeJobs returns n prompt-token jobs (no tokenizer needed) with custom ids job-00000….
func makeJobs(n int) []jobs.Job {
	maxTokens := 8
	out := make([]jobs.Job, n)
	for i := range out {
		out[i] = jobs.Job{
			CustomID:     fmt.Sprintf("job-%05d", i),
			Model:        "Qwen/Qwen3-8B",
			PromptTokens: []int{151644, 872, 198, 1000 + i},
			NumSamples:   1,
			Params:       jobs.SamplingParams{MaxTokens: &maxTokens},
		}
	}
	return out
}

// publishJobs publishes js in batch and waits for every ack (retrying through elections).
func publishJobs(t testing.TB, q *queue.Queue, batch string, js []jobs.Job) {
	t.Helper()
	fleettest.Publish(t, q, batch, js)
}

// readResults reads every stored result of batch and counts them per custom id (the value
// is how many result messages the stream holds for it).
func readResults(t testing.TB, q *queue.Queue, batch string) (map[string]int, map[string]jobs.Result) {
	t.Helper()
	results, counts := fleettest.Results(t, q, batch, 0, 0)
	return counts, results
}
