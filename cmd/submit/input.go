package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Compressed input is told by its first bytes, whatever the file is called: a JSONL line
// begins with '{' or white space, never with these.
var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
	// zstdSkippable ends the magic number of a zstd skippable frame, 0x184D2A5?: pzstd and
	// seekable zstd begin their files with one.
	zstdSkippable = []byte{0x2a, 0x4d, 0x18}
	// Read as text, these would make a line error of every line.
	xzMagic    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	bzip2Magic = []byte("BZh")
	zipMagic   = []byte{'P', 'K', 0x03, 0x04}
)

// zstdMaxWindow bounds the memory a zstd input may ask for: 128 MiB, the window of
// `zstd --long`.
const zstdMaxWindow = 128 << 20

// inputFile is an input file opened for reading its lines, decompressed if it is gzip or zstd.
type inputFile struct {
	io.Reader
	file    *os.File
	release func() // releases the decompressor
}

// checkReadTwice returns an error when the input named name is standard input, or, unless
// once, a pipe or a device: submit reads its input twice (every line is validated before the
// first is published), and failed reads it again later, which only a file allows. once is
// for a dry run, which reads it once: a pipe, by its name (/dev/stdin for standard input).
// Other errors are left to openInput.
func checkReadTwice(name string, once bool) error {
	const why = "submit reads its input twice, to validate every line before it publishes one, and failed reads it again later: write it to a file first, as in '… > prompts.jsonl'"
	fi, err := os.Stat(name)
	switch {
	case err != nil && name == "-" && once:
		return fmt.Errorf("input %q: a dry run reads standard input by its name: give /dev/stdin, as in '… | submit --dry-run /dev/stdin'", name)
	case err != nil && name == "-":
		return fmt.Errorf("input %q: standard input cannot be read: %s", name, why)
	case err != nil || once || fi.Mode().IsRegular() || fi.IsDir():
		return nil
	}
	kind := "a device"
	switch fi.Mode().Type() {
	case fs.ModeNamedPipe:
		kind = "a pipe"
	case fs.ModeSocket:
		kind = "a socket"
	}
	return fmt.Errorf("input %s is %s, which cannot be read again: %s", name, kind, why)
}

// checkDistinct refuses a file given twice, under one name or two (a path and a link to it, a
// shell glob that overlaps another argument). Each of its lines would otherwise be reported
// as a duplicate custom_id of itself, "first used on line 1" of the same file, line by line.
// It refuses as well an output file (-o, --rejects; a path of "" is none) that is one of the
// inputs, or another output: what is written there would replace or follow the other's lines.
func checkDistinct(files []string, outputs ...outputPath) error {
	bySize := make(map[int64][]int) // files that may be the same, by size
	infos := make([]fs.FileInfo, len(files))
	for i, name := range files {
		fi, err := os.Stat(name)
		if err != nil || !fi.Mode().IsRegular() {
			continue // said when it is opened
		}
		for _, j := range bySize[fi.Size()] {
			if os.SameFile(infos[j], fi) {
				also := ""
				if files[j] != name {
					also = " (also as " + files[j] + ")"
				}
				return fmt.Errorf("input %s is given twice%s: give each file once: %w", name, also, errUsage)
			}
		}
		infos[i] = fi
		bySize[fi.Size()] = append(bySize[fi.Size()], i)
	}
	for k, o := range outputs {
		if o.path == "" {
			continue
		}
		for _, p := range outputs[:k] {
			if p.path != "" && samePath(p.path, o.path) {
				return fmt.Errorf("%s %s is also %s: give each its own file: %w", o.flag, o.path, p.flag, errUsage)
			}
		}
		out, err := os.Stat(o.path)
		if err != nil {
			continue // a new file, or one its opening reports
		}
		for _, j := range bySize[out.Size()] {
			if os.SameFile(infos[j], out) {
				return fmt.Errorf("%s %s is the input file %s: give the output a file of its own: %w", o.flag, o.path, files[j], errUsage)
			}
		}
	}
	return nil
}

// outputPath is a file a command writes, and the flag that names it.
type outputPath struct{ flag, path string }

// samePath reports whether a and b name one file: the same path, or two names of a file that
// exists.
func samePath(a, b string) bool {
	absA, errA := filepath.Abs(a)
	absB, errB := filepath.Abs(b)
	if errA == nil && errB == nil && absA == absB {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// openInput opens the input file name: JSONL, or JSONL compressed with gzip or zstd. Lines,
// line numbers and the batch's digest are those of the decompressed text, so a file
// compressed again, another way, is the same batch.
func openInput(name string, read *atomic.Int64) (*inputFile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open input: %w", err)
	}
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		f.Close()
		return nil, fmt.Errorf("open input: %s is a directory: give the JSONL files in it", name)
	}
	var raw io.Reader = f
	if read != nil {
		raw = countedReader{f, read}
	}
	r, _, release, err := decompressed(name, bufio.NewReaderSize(raw, 64<<10))
	if err != nil {
		f.Close()
		return nil, err
	}
	return &inputFile{Reader: r, file: f, release: release}, nil
}

// countedReader adds the bytes read from r to n. Atomic: a zstd input is read on its
// decoder's goroutine, not on the one that draws the pass's progress.
type countedReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// inputSize is the size of the files as they are stored (compressed or not), which the bytes
// read from them come to; 0 when it is not known: one is not a regular file (a pipe), or
// cannot be read.
func inputSize(files []string) int64 {
	var total int64
	for _, name := range files {
		fi, err := os.Stat(name)
		if err != nil || !fi.Mode().IsRegular() {
			return 0
		}
		total += fi.Size()
	}
	return total
}

// Close releases the decompressor and closes the file.
func (in *inputFile) Close() error {
	in.release()
	return in.file.Close()
}

// decompressed reads br, the file name, as the text it holds: br itself, or its gzip or zstd
// stream decompressed, told by its first bytes (kind: "gzip", "zstd" or ""). release frees
// the decompressor.
func decompressed(name string, br *bufio.Reader) (r io.Reader, kind string, release func(), err error) {
	head, _ := br.Peek(len(xzMagic)) // a shorter file is none of them
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, "", nil, fmt.Errorf("open %s: gzip: %w", name, err)
		}
		return zr, "gzip", func() {}, nil
	case bytes.HasPrefix(head, zstdMagic), len(head) >= 4 && head[0]&0xf0 == 0x50 && bytes.Equal(head[1:4], zstdSkippable):
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, "", nil, fmt.Errorf("open %s: zstd: %w", name, err)
		}
		return zr, "zstd", zr.Close, nil
	case bytes.HasPrefix(head, xzMagic):
		return nil, "", nil, unreadable(name, "xz")
	case bytes.HasPrefix(head, bzip2Magic):
		return nil, "", nil, unreadable(name, "bzip2")
	case bytes.HasPrefix(head, zipMagic):
		return nil, "", nil, fmt.Errorf("%s is a zip archive: give the JSONL file it holds, or compress it with zstd or gzip", name)
	case isUTF16(head):
		return nil, "", nil, fmt.Errorf("%s is UTF-16 text, and JSONL is UTF-8: convert it first, as in 'iconv -f UTF-16 -t UTF-8 %s > prompts.jsonl'", name, name)
	}
	return br, "", func() {}, nil
}

// isUTF16 reports whether a file that begins with head is UTF-16 (or UTF-32) text: it begins
// with a byte order mark other than UTF-8's, or its first character is ASCII beside a NUL
// byte. A UTF-8 JSON text holds no NUL byte, and no FE or FF.
func isUTF16(head []byte) bool {
	if len(head) < 2 {
		return false
	}
	ascii := func(b byte) bool { return b >= '\t' && b <= '~' }
	bom := (head[0] == 0xff && head[1] == 0xfe) || (head[0] == 0xfe && head[1] == 0xff)
	return bom || (head[0] == 0 && ascii(head[1])) || (ascii(head[0]) && head[1] == 0)
}

// unreadable is the error for a file compressed in a way submit does not read.
func unreadable(name, kind string) error {
	return fmt.Errorf("%s is compressed with %s: give it as JSONL, or compressed with zstd or gzip", name, kind)
}
