// Package envflag defines command-line flags whose defaults come from environment variables,
// so that every setting of the tinkerfleet programs can be given either way (flags win). The
// variable's name is appended to the usage text, which makes -h the configuration table.
package envflag
