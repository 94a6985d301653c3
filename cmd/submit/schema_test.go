package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// loadSchema reads schemas/NAME as generic JSON.
func loadSchema(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "schemas", name))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("%s: $schema = %v", name, s["$schema"])
	}
	return s
}

// jsonFields lists the JSON names of typ's fields (those of embedded structs in place) and
// those always written (no omitempty or omitzero).
func jsonFields(typ reflect.Type) (all, always []string) {
	for f := range typ.Fields() {
		if f.Anonymous {
			a, w := jsonFields(f.Type)
			all, always = append(all, a...), append(always, w...)
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			always = append(always, name)
		}
	}
	return all, always
}

// compileSchema compiles schemas/NAME, with its formats (date-time) asserted.
func compileSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile(filepath.Join("..", "..", "schemas", name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// validLine validates one JSON document against s.
func validLine(s *jsonschema.Schema, line []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(line))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

func keys(m any) []string {
	var k []string
	for name := range m.(map[string]any) {
		k = append(k, name)
	}
	slices.Sort(k)
	return k
}

func strs(v any) []string {
	var s []string
	for _, x := range v.([]any) {
		s = append(s, x.(string))
	}
	slices.Sort(s)
	return s
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestOutputSchemasNameTheStructsFields checks that the schemas of the rejects file and of
// status and list --json name exactly the fields of the structs written, and require those
// written always.
func TestOutputSchemasNameTheStructsFields(t *testing.T) {
	t.Parallel()
	rejects, status, list := loadSchema(t, "rejects.schema.json"), loadSchema(t, "status.schema.json"), loadSchema(t, "list.schema.json")
	check := func(what string, schema map[string]any, typ reflect.Type) {
		t.Helper()
		all, always := jsonFields(typ)
		if got := keys(schema["properties"]); !slices.Equal(got, sorted(all)) {
			t.Errorf("%s: properties %v, %s writes %v", what, got, typ, sorted(all))
		}
		if got := strs(schema["required"]); !slices.Equal(got, sorted(always)) {
			t.Errorf("%s: required %v, %s always writes %v", what, got, typ, sorted(always))
		}
		if schema["additionalProperties"] != false {
			t.Errorf("%s: additionalProperties is not false", what)
		}
	}
	defs := func(s map[string]any, name string) map[string]any {
		return s["$defs"].(map[string]any)[name].(map[string]any)
	}
	check("rejects", rejects, reflect.TypeFor[rejectLine]())
	check("status", status, reflect.TypeFor[batchStatus]())
	check("status workers", status["properties"].(map[string]any)["workers"].(map[string]any), reflect.TypeFor[workerCount]())
	check("status usage", defs(status, "usage"), reflect.TypeFor[queue.Tokens]())
	check("list", list, reflect.TypeFor[listedBatch]())
	manifest := defs(status, "manifest")
	if !reflect.DeepEqual(manifest, defs(list, "manifest")) {
		t.Error("the manifest definitions of status.schema.json and list.schema.json differ")
	}
	all, always := jsonFields(reflect.TypeFor[queue.Manifest]())
	if got := keys(manifest["properties"]); !slices.Equal(got, sorted(all)) {
		t.Errorf("manifest properties %v, queue.Manifest has %v", got, sorted(all))
	}
	if got := strs(manifest["required"]); !slices.Equal(got, sorted(always)) {
		t.Errorf("manifest required %v, queue.Manifest always writes %v", got, sorted(always))
	}
	statuses := manifest["properties"].(map[string]any)["status"].(map[string]any)["enum"]
	if got, want := strs(statuses), sorted([]string{queue.BatchPublishing, queue.BatchSubmitted, queue.BatchCancelled, queue.BatchDeleted}); !slices.Equal(got, want) {
		t.Errorf("manifest status enum %v, want %v", got, want)
	}
	for name, s := range map[string]map[string]any{"rejects": rejects, "status": status, "list": list} {
		compiled := compileSchema(t, name+".schema.json")
		for _, ex := range s["examples"].([]any) {
			b, _ := json.Marshal(ex)
			if err := validLine(compiled, b); err != nil {
				t.Errorf("%s example %s: %v", name, b, err)
			}
		}
	}
	for _, ex := range rejects["examples"].([]any) {
		b, _ := json.Marshal(ex)
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var r rejectLine
		if err := dec.Decode(&r); err != nil {
			t.Errorf("rejects example %s: %v", b, err)
		}
	}
}

// TestOutputsFollowTheirSchemas writes a rejects file, status --json and list --json of
// batches in several states, and validates every line against its schema.
func TestOutputsFollowTheirSchemas(t *testing.T) {
	t.Parallel()
	schemas := map[string]*jsonschema.Schema{}
	for _, name := range []string{"rejects", "status", "list"} {
		schemas[name] = compileSchema(t, name+".schema.json")
	}
	valid := func(name, lines string) {
		t.Helper()
		if strings.TrimSpace(lines) == "" {
			t.Fatalf("no %s output", name)
		}
		for line := range strings.Lines(lines) {
			if err := validLine(schemas[name], []byte(line)); err != nil {
				t.Errorf("%s line %s: %v", name, strings.TrimSpace(line), err)
			}
		}
	}
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 16})
	ctx := context.Background()
	dir := t.TempDir()
	in := writeLines(t, append(jobLines(12),
		`{"custom_id":"job-00000","model":"Qwen/Qwen3-8B","prompt":"again"}`,
		"{not json",
		`{"custom_id":"y","model":"Qwen/Qwen3-8B","prompt":"a","colour":"red"}`,
		"{\"custom_id\":\"u\",\"model\":\"Qwen/Qwen3-8B\",\"prompt\":\"\xff\xfe\"}",
		`{"custom_id":"c","model":"moonshotai/Kimi-K2-Thinking","messages":[{"role":"user","content":"hi"}]}`,
		`[1]`,
	))
	rejects := filepath.Join(dir, "rejects.jsonl")
	mustRun := func(args ...string) string {
		t.Helper()
		stdout, stderr, err := f.submit(ctx, args...)
		if err != nil {
			t.Fatalf("submit %q: %v: %s", args, err, stderr)
		}
		return stdout
	}
	mustRun("--skip-invalid", "--rejects", rejects, "--batch-id", "schema-a", in)
	data, err := os.ReadFile(rejects)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != 6 {
		t.Fatalf("%d rejects, want 6:\n%s", n, data)
	}
	valid("rejects", string(data))
	valid("status", mustRun("status", "--json", "schema-a")) // no worker yet: activity
	mustRun(writeLines(t, jobLines(5)), "--batch-id", "schema-b")
	mustRun("cancel", "schema-b")
	valid("status", mustRun("status", "--json", "schema-b")) // cancelled, not done
	valid("list", mustRun("list", "--json"))

	f.startWorker(8)
	mustRun("results", "schema-a", "--wait", "-o", filepath.Join(dir, "a.jsonl"))
	mustRun("results", "schema-b", "--wait", "-o", filepath.Join(dir, "b.jsonl"))
	valid("status", mustRun("status", "--json", "schema-a")) // done
	valid("status", mustRun("status", "--json", "schema-b")) // cancelled, done
	mustRun("delete", "schema-b")
	valid("status", mustRun("status", "--json", "schema-b")) // deleted
	valid("list", mustRun("list", "--json"))
}
