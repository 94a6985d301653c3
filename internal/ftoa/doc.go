// Package ftoa writes a float32 as the shortest decimal that reads back as the same float32,
// byte for byte as strconv.AppendFloat(dst, float64(f), 'g', -1, 32) does, in about half its
// time.
//
// Result lines carry a logprob for every sampled token and, when asked, up to 21 for every
// prompt token: writing them as text is most of the work of writing a long result. strconv
// finds the shortest digits quickly (Dragonbox) but spends twice as long again on its general
// layout code; this package finds them with Schubfach (R. Giulietti, "The Schubfach way to
// render doubles", 2020, and the float case of its Java implementation, FloatToDecimal), and
// lays out the 'g' form directly.
//
// Every one of the 2^32 bit patterns has been checked against strconv (go test -exhaustive,
// about two and a half minutes on two cores); the default tests check every binary exponent's
// edges, the subnormals and a million random patterns.
package ftoa
