package corpus

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Prose is English written for the corpus.
const Prose = `The fleet woke before dawn. Each worker pulled a job, looked at the prompt, and counted its tokens
before asking the sampler for more. "We don't guess," said the lead, "we measure." They'd learned that
lesson the hard way: a batch of 40,000 prompts, a context window of 32,768 tokens, and one prompt that
was 1.5 MB of log output. It's the kind of thing you'll only see once... and then you'll see it again.
Numbers matter: 3.14159, 2.71828, 1e-9, -42, 0x1F, 1,000,000 and 12:30 PM are all tokenized differently.
    Indented lines keep their spaces; trailing spaces too.   
Tabs	separate	columns	here.
Windows line endings end this line.` + "\r\n" + `And  double  spaces,   triple   spaces, and a final question?!
I'M SHOUTING, YOU'RE LISTENING, WE'VE WON, THEY'LL SEE, HE'D KNOW, IT'S DONE.
`

// Multilingual is CJK, other scripts, emoji and unusual spaces and marks.
const Multilingual = "日本語のテキストも大丈夫です。中文测试：你好，世界！한국어 문장도 있습니다.\n" +
	"Ελληνικά και русский текст, עברית, مرحبا بالعالم, हिन्दी पाठ, ไทย ภาษา.\n" +
	"Emoji 🚀🔥👍🏽 and ZWJ 👨‍👩‍👧 families, flags 🇩🇪🇯🇵, keycaps 1️⃣ #️⃣.\n" +
	"Combining: e\u0301 a\u0308 n\u0303, Ünïcödé àccents çédille naïve café.\n" +
	"Spaces:\u00a0nbsp,\u3000ideographic,\u2003em,\u2009thin, zero\u200bwidth.\n" +
	"Digits: ١٢٣ ४५६ ⅫⅣ ½¾ ²³ 𝟙𝟚𝟛 ０１２３４５６７８９.\n" +
	"Symbols: © ® ™ € £ ¥ ± × ÷ → ← ∀ ∃ ∑ ∫ ≤ ≥ ≠ ∞ «quotes» „low“ ‘single’ — – …\n" +
	"Code: if (x != nil) { return fmt.Errorf(\"%w\", err) } // it's fine\r\n\t\tx := []int{1, 22, 333, 4444, 55555}\n"

// Build returns a deterministic text of at least size bytes: Prose, Multilingual and up to 20 kB
// of a Go source file of $GOROOT/src/net/http, repeated with a line of numbers between rounds.
// It needs the go command (for GOROOT) and fails when the Go source is not there.
func Build(size int) (string, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("corpus: go env GOROOT: %w", err)
	}
	goroot := strings.TrimSpace(string(out))
	files, err := filepath.Glob(filepath.Join(goroot, "src", "net", "http", "*.go"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("corpus: no Go source under GOROOT (%s): %v", goroot, err)
	}
	slices.Sort(files)
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		b.WriteString(Prose)
		b.WriteString(Multilingual)
		src, err := os.ReadFile(files[i%len(files)])
		if err != nil {
			return "", fmt.Errorf("corpus: %w", err)
		}
		b.Write(src[:min(len(src), 20000)])
		fmt.Fprintf(&b, "\n%d %d.%d\n", i*7919, i, i*31)
	}
	return b.String(), nil
}
