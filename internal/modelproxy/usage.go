package modelproxy

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"strings"
)

// usage is what a provider reported an answer used, in either API's
// words: Anthropic's input, cache and output tokens, or OpenAI's prompt
// and completion tokens (whose prompt includes cached tokens). Counts are
// decoded as numbers of any form and bounded when summed.
type usage struct {
	InputTokens              float64 `json:"input_tokens"`
	CacheCreationInputTokens float64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     float64 `json:"cache_read_input_tokens"`
	OutputTokens             float64 `json:"output_tokens"`
	PromptTokens             float64 `json:"prompt_tokens"`
	CompletionTokens         float64 `json:"completion_tokens"`
}

// maxTokens bounds each reported count: the store refuses more in one
// addition, and no answer uses anywhere near as many.
const maxTokens = 1 << 40

// input is every token of the prompt, cache writes and reads included:
// they are billed, and an agent's conversation is mostly cache reads.
func (u usage) input() int64 {
	return tokens(u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens + u.PromptTokens)
}

func (u usage) output() int64 { return tokens(u.OutputTokens + u.CompletionTokens) }

func tokens(v float64) int64 {
	if !(v > 0) { // also NaN
		return 0
	}
	return int64(math.Min(v, maxTokens))
}

// merge keeps the larger of each count: an Anthropic stream reports the
// input in message_start and the output so far in each message_delta
// (newer versions repeat the input there), an OpenAI stream its whole
// usage once, in its last chunk.
func (u *usage) merge(v usage) {
	u.InputTokens = max(u.InputTokens, v.InputTokens)
	u.CacheCreationInputTokens = max(u.CacheCreationInputTokens, v.CacheCreationInputTokens)
	u.CacheReadInputTokens = max(u.CacheReadInputTokens, v.CacheReadInputTokens)
	u.OutputTokens = max(u.OutputTokens, v.OutputTokens)
	u.PromptTokens = max(u.PromptTokens, v.PromptTokens)
	u.CompletionTokens = max(u.CompletionTokens, v.CompletionTokens)
}

// usageScanner reads an answer's usage as the answer passes through, in
// pieces, without keeping the answer.
type usageScanner interface {
	write(p []byte)
	usage() usage
}

// scannerFor chooses how to read an answer's usage by its content type;
// nil when it has none to read.
func scannerFor(contentType string) usageScanner {
	switch {
	case strings.HasPrefix(contentType, "application/json"):
		return &jsonUsage{}
	case strings.HasPrefix(contentType, "text/event-stream"):
		return &sseUsage{}
	}
	return nil
}

// tap passes an answer on and shows every piece to a scanner.
type tap struct {
	rc   io.ReadCloser
	scan usageScanner
}

func (t *tap) Read(b []byte) (int, error) {
	n, err := t.rc.Read(b)
	t.scan.write(b[:n])
	return n, err
}

func (t *tap) Close() error { return t.rc.Close() }

// maxUsageObject bounds the usage object a JSON answer may report, and
// maxEventLine an event's line in a stream; usage objects are a few
// hundred bytes.
const (
	maxUsageObject = 64 << 10
	maxEventLine   = 1 << 20
)

// jsonUsage finds the value of a JSON answer's top-level "usage" key. It
// follows the answer's structure byte by byte (strings, escapes, nesting)
// rather than keeping the answer, because answers can be large (an
// embeddings answer is tens of megabytes, its usage at the end) and a
// "usage" that is not at the top level (inside a message's content, say)
// must not count.
type jsonUsage struct {
	depth      int
	inString   bool
	escaped    bool
	str        []byte // the string being read at depth 1, up to len("usage")+1 bytes
	lastIsKey  bool   // the last string completed at depth 1 was "usage"
	afterColon bool   // at depth 1, between a key's colon and its value
	capturing  bool
	buf        []byte // the usage object being read
	found      usage
}

func (s *jsonUsage) write(p []byte) {
	for _, c := range p {
		s.step(c)
	}
}

func (s *jsonUsage) step(c byte) {
	if s.capturing {
		if len(s.buf) >= maxUsageObject {
			s.capturing, s.buf = false, nil
		} else {
			s.buf = append(s.buf, c)
		}
	}
	if s.inString {
		switch {
		case s.escaped:
			s.escaped = false
		case c == '\\':
			s.escaped = true
		case c == '"':
			s.inString = false
			if s.depth == 1 {
				s.lastIsKey = string(s.str) == "usage"
			}
		case s.depth == 1 && len(s.str) <= len("usage"):
			s.str = append(s.str, c)
		}
		return
	}
	switch c {
	case '"':
		s.inString, s.str, s.afterColon = true, s.str[:0], false
	case ':':
		s.afterColon = s.depth == 1 && s.lastIsKey
	case ',':
		s.lastIsKey, s.afterColon = false, false
	case '{', '[':
		if s.depth == 1 && s.afterColon && c == '{' {
			s.capturing, s.buf = true, append(s.buf[:0], c)
		}
		s.afterColon = false
		s.depth++
	case '}', ']':
		s.depth--
		if s.capturing && s.depth == 1 {
			s.capturing = false
			var u usage
			if json.Unmarshal(s.buf, &u) == nil {
				s.found = u
			}
		}
	}
}

func (s *jsonUsage) usage() usage { return s.found }

// sseUsage reads the usage a stream of Server-Sent Events reports:
// Anthropic's message_start (message.usage) and message_delta (usage)
// events, OpenAI's last chunk (usage). Only data lines that mention
// "usage" are decoded.
type sseUsage struct {
	line     []byte
	skipping bool // the current line is longer than maxEventLine
	total    usage
}

func (s *sseUsage) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.add(p)
			return
		}
		s.add(p[:i])
		s.endLine()
		p = p[i+1:]
	}
}

func (s *sseUsage) add(p []byte) {
	if s.skipping {
		return
	}
	if len(s.line)+len(p) > maxEventLine {
		s.skipping, s.line = true, s.line[:0]
		return
	}
	s.line = append(s.line, p...)
}

func (s *sseUsage) endLine() {
	line, skipped := s.line, s.skipping
	s.line, s.skipping = s.line[:0], false
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if skipped || !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	var ev struct {
		Usage   *usage `json:"usage"`
		Message *struct {
			Usage *usage `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(bytes.TrimSpace(data), &ev) != nil {
		return
	}
	if ev.Usage != nil {
		s.total.merge(*ev.Usage)
	}
	if ev.Message != nil && ev.Message.Usage != nil {
		s.total.merge(*ev.Message.Usage)
	}
}

// usage includes a last line the stream did not end.
func (s *sseUsage) usage() usage {
	if len(s.line) > 0 {
		s.endLine()
	}
	return s.total
}
